"""The end check: a run that attempted every step but learned nothing fails instead of succeeding.

``no_update_applied`` when no step of the job applied an update; the guard's reasons when
the run ended inside a stretch of skipped steps (or non-finite losses) of at least
``min(limit, max(3, ceil(max_steps / 10)))``; a healthy run whose last one or two steps
overflowed still succeeds. Failures come before the final evaluation, ``final.pt`` and the
``end`` record, and ``on_divergence: "fallback_bf16"`` answers them like the guard's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trainer_support import json_records

from halfcast.contracts.records import EndRecord
from halfcast.contracts.spec import JobSpec
from trainer.errors import TrainerError
from trainer.parallel.distributed import DistContext
from trainer.records import RecordSink
from trainer.run.checkpoint import final_path, step_path
from trainer.run.end_check import check_updates_applied, final_stretch_limit
from trainer.run.guard import DivergenceGuard
from trainer.run.loop import train
from trainer.run.telemetry import StepRow

SpecFactory = Callable[..., JobSpec]
INF, NAN = 1.0, 2.0


def _types(run_dir: Path) -> list[str]:
    """The record types of ``run_dir``, start-up phases left out."""
    return [r["type"] for r in json_records(run_dir) if r["type"] != "phase"]


def _end(run_dir: Path) -> dict[str, Any]:
    records = json_records(run_dir)
    assert records[-1]["type"] == "end", _types(run_dir)
    return records[-1]


def _row(step: int, kind: float = 0.0, loss: float = 1.0, scale: float = 4.0) -> StepRow:
    return StepRow(
        step=step,
        time=0.0,
        loss=loss,
        loss_scale=scale,
        overflow_kind=kind,
        skipped_steps=0,
        grad_norm=1.0,
        lr=0.1,
        samples=8,
        tokens=None,
    )


def _guard(kinds: list[float], losses: list[float] | None = None) -> DivergenceGuard:
    guard = DivergenceGuard(max_skips=50, max_nonfinite_losses=10, min_scale=1.0)
    losses = losses or [1.0] * len(kinds)
    guard.observe(_row(step, kind, loss) for step, (kind, loss) in enumerate(zip(kinds, losses, strict=True), start=1))
    return guard


@pytest.mark.parametrize(
    ("limit", "max_steps", "expected"),
    [(50, 1, 3), (50, 10, 3), (50, 30, 3), (50, 31, 4), (50, 100, 10), (50, 10_000, 50), (2, 10, 2)],
)
def test_the_final_stretch_limit_is_a_tenth_of_the_run_between_3_and_the_guards(
    limit: int, max_steps: int, expected: int
) -> None:
    assert final_stretch_limit(limit, max_steps) == expected


def test_an_fp16_job_whose_every_step_overflowed_fails_no_update_applied(
    tiny_mlp_spec: SpecFactory, cpu_ctx: DistContext, tmp_path: Path
) -> None:
    """The issue's case: 10 fp16 steps, every one skipped, far below max_consecutive_skips (50)."""
    spec = tiny_mlp_spec(
        precision="fp16", max_steps=10, faults={"nonfinite_grad_from_step": 1, "nonfinite_value": "inf"}
    )
    with pytest.raises(TrainerError) as info:
        train(spec, tmp_path, cpu_ctx)
    assert info.value.reason == "no_update_applied" and "all 10 attempted steps were skipped" in info.value.message
    assert _types(tmp_path) == ["start"] + ["step"] * 10  # no final evaluation, no end record
    assert not final_path(tmp_path).exists()


@pytest.mark.parametrize(("value", "reason"), [("nan", "nonfinite_gradients"), ("inf", "loss_scale_collapsed")])
def test_a_run_that_ended_in_a_long_stretch_of_skipped_steps_fails_with_the_guards_reason(
    tiny_mlp_spec: SpecFactory, cpu_ctx: DistContext, tmp_path: Path, value: str, reason: str
) -> None:
    """Steps 1-5 learn, 6-10 overflow: the last 5 of 10 (>= 3) learned nothing. With +inf the scale
    backs off 4 -> 2 -> 1 (min_scale) and sits there: collapsed, as the guard would have said."""
    spec = tiny_mlp_spec(
        precision="fp16",
        max_steps=10,
        loss_scale={"init_scale": 4.0},
        faults={"nonfinite_grad_from_step": 6, "nonfinite_value": value},
    )
    with pytest.raises(TrainerError) as info:
        train(spec, tmp_path, cpu_ctx)
    assert info.value.reason == reason
    assert "the last 5 of 10 steps" in info.value.message and "after 5 applied updates" in info.value.message
    assert "end" not in _types(tmp_path) and not final_path(tmp_path).exists()


@pytest.mark.parametrize("overflows", [[10], [9, 10]])
def test_a_healthy_run_whose_last_steps_overflowed_still_succeeds(
    tiny_mlp_spec: SpecFactory, cpu_ctx: DistContext, tmp_path: Path, overflows: list[int]
) -> None:
    spec = tiny_mlp_spec(precision="fp16", max_steps=10, faults={"nonfinite_grad_steps": overflows})
    result = train(spec, tmp_path, cpu_ctx)
    assert (result.applied_steps, result.skipped_steps) == (10 - len(overflows), len(overflows))
    assert _end(tmp_path) == {
        **_end(tmp_path),
        "steps": 10,
        "skipped_steps": len(overflows),
        "applied_steps": 10 - len(overflows),
    }
    assert final_path(tmp_path).exists()


def test_applied_steps_count_the_history_before_a_resume(
    tiny_mlp_spec: SpecFactory, cpu_ctx: DistContext, tmp_path: Path
) -> None:
    """Resumed at step 18 of 20, both of its own steps skipped: 18 updates of the job were applied, so it succeeds."""
    first = tiny_mlp_spec(precision="fp16", max_steps=20, checkpoint_interval=18)
    train(first, tmp_path / "first", cpu_ctx)
    spec = tiny_mlp_spec(
        precision="fp16", max_steps=20, checkpoint_interval=18, faults={"nonfinite_grad_steps": [19, 20]}
    )
    result = train(spec, tmp_path / "resumed", cpu_ctx, resume_from=step_path(tmp_path / "first", 18))
    assert (result.applied_steps, result.skipped_steps) == (18, 2)
    assert _end(tmp_path / "resumed")["applied_steps"] == 18


def test_a_final_stretch_of_nonfinite_losses_fails_nonfinite_loss() -> None:
    guard = _guard([0.0] * 7 + [NAN] * 3, [1.0] * 7 + [math.nan] * 3)
    with pytest.raises(TrainerError) as info:
        check_updates_applied(guard, max_steps=10, skipped_steps=3)
    assert info.value.reason == "nonfinite_loss" and "the last 3 of 10 steps" in info.value.message


def test_no_update_applied_comes_first_and_counts_the_whole_trajectory() -> None:
    """Two steps, both skipped: too short a stretch for the final-stretch rule, but nothing was applied."""
    with pytest.raises(TrainerError) as info:
        check_updates_applied(_guard([NAN, NAN], [math.nan, math.nan]), max_steps=2, skipped_steps=2)
    assert info.value.reason == "no_update_applied"
    check_updates_applied(_guard([0.0, NAN]), max_steps=2, skipped_steps=1)  # one applied update: it learned


def test_windows_without_a_supervised_token_are_no_update() -> None:
    """Issue 25 item 7: an empty window counted as applied, so a job whose only other step was skipped passed."""
    with pytest.raises(TrainerError) as info:
        check_updates_applied(_guard([0.0, NAN]), max_steps=2, skipped_steps=1, empty_windows=1)
    assert info.value.reason == "no_update_applied"
    assert "1 were skipped (non-finite gradients) and 1 held no supervised token" in info.value.message
    check_updates_applied(_guard([0.0, 0.0, NAN]), max_steps=3, skipped_steps=1, empty_windows=1)


def test_the_end_record_counts_empty_windows_apart(tmp_path: Path) -> None:
    with RecordSink(tmp_path / "records.jsonl") as records:
        records.end(steps=10, skipped_steps=2, empty_windows=3)
        records.end(steps=10, skipped_steps=2)
    with_empty, without = [r for r in json_records(tmp_path) if r["type"] == "end"]
    assert (with_empty["applied_steps"], with_empty["empty_windows"]) == (5, 3)
    assert without["applied_steps"] == 8 and "empty_windows" not in without
    assert EndRecord.model_validate({"steps": 10, "skipped_steps": 2, "empty_windows": 3}).applied == 5


def test_fallback_bf16_answers_no_update_applied_from_step_0(
    tiny_mlp_spec: SpecFactory, cpu_ctx: DistContext, tmp_path: Path
) -> None:
    """Every fp16 step overflows (faults in fp16 only): the end check fails it, the job rewinds to step 0
    and trains all 6 steps again in bf16, applying every update."""
    spec = tiny_mlp_spec(
        precision="fp16",
        max_steps=6,
        on_divergence="fallback_bf16",
        faults={"nonfinite_grad_from_step": 1, "nonfinite_grad_precisions": ["fp16"]},
    )
    result = train(spec, tmp_path, cpu_ctx)
    records = json_records(tmp_path)
    [switch] = [r for r in records if r["type"] == "precision_switch"]
    assert (switch["step"], switch["reason"], switch["rewound_to_step"]) == (6, "no_update_applied", 0)
    after = [r for r in records[records.index(switch) :] if r["type"] == "step"]
    assert [s["step"] for s in after] == list(range(1, 7)) and all(s["precision"] == "bf16" for s in after)
    assert (result.applied_steps, _end(tmp_path)["applied_steps"]) == (6, 6)


def test_fallback_bf16_answers_a_final_stretch_from_the_checkpoint_before_it(
    tiny_mlp_spec: SpecFactory, cpu_ctx: DistContext, tmp_path: Path
) -> None:
    """Steps 8-10 overflow in fp16: the stretch began at step 8, so the job rewinds to step-5.pt (not
    step 0, nor past the stretch's start) and re-runs 6-10 in bf16."""
    spec = tiny_mlp_spec(
        precision="fp16",
        max_steps=10,
        checkpoint_interval=5,
        on_divergence="fallback_bf16",
        faults={"nonfinite_grad_from_step": 8, "nonfinite_grad_precisions": ["fp16"]},
    )
    result = train(spec, tmp_path, cpu_ctx)
    [switch] = [r for r in json_records(tmp_path) if r["type"] == "precision_switch"]
    assert (switch["step"], switch["reason"], switch["rewound_to_step"]) == (10, "nonfinite_gradients", 5)
    assert (result.applied_steps, result.skipped_steps) == (10, 0)
