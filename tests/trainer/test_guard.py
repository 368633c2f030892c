"""Divergence guard: consecutive skipped steps and non-finite losses end the job with a typed reason.

The guard reads host rows of the device step log (trainer/run/telemetry.py): reasons
``nonfinite_gradients``, ``loss_scale_collapsed`` (scale at min_scale, infinities only)
and ``nonfinite_loss``; a real fp16 run reaches ``loss_scale_collapsed``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
from trainer_support import json_records

from halfcast.contracts.spec import JobSpec
from halfcast.contracts.status import FailureReason
from trainer.errors import DIVERGENCE_REASONS, DivergenceError, TrainerError
from trainer.parallel.distributed import DistContext
from trainer.run.end_check import check_updates_applied
from trainer.run.guard import DivergenceGuard
from trainer.run.loop import train
from trainer.run.telemetry import StepRow

INF, NAN = 1.0, 2.0


def _row(step: int, kind: float = 0.0, loss: float = 1.0, scale: float = 1.0) -> StepRow:
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


def test_consecutive_skips_fail_and_a_clean_step_resets() -> None:
    guard = DivergenceGuard(max_skips=3, max_nonfinite_losses=10)
    guard.observe(_row(step, kind) for step, kind in enumerate([NAN, NAN, 0.0, INF, INF], start=1))
    with pytest.raises(TrainerError) as info:
        guard.observe([_row(6, INF)])
    assert info.value.reason == "nonfinite_gradients" and "3 consecutive" in info.value.message
    assert "at step 6" in info.value.message


def test_consecutive_nonfinite_losses_fail() -> None:
    guard = DivergenceGuard(max_skips=10, max_nonfinite_losses=2)
    guard.observe([_row(1, loss=math.nan), _row(2, loss=0.5), _row(3, loss=math.inf)])
    with pytest.raises(TrainerError) as info:
        guard.observe([_row(4, loss=math.nan), _row(5)])
    assert info.value.reason == "nonfinite_loss" and "at step 4" in info.value.message
    assert guard.state_dict() == {"consecutive_skips": 0, "consecutive_nonfinite_losses": 2, "nan_skips_in_run": 0}


@pytest.mark.parametrize(
    ("kinds", "scale", "reason"),
    [
        ([INF, INF, INF], 1.0, "loss_scale_collapsed"),  # pinned at min_scale, only infinities
        ([INF, NAN, INF], 1.0, "nonfinite_gradients"),  # a NaN in the run: not the scale's fault
        ([INF, INF, INF], 2.0, "nonfinite_gradients"),  # the scale could still back off
    ],
)
def test_collapsed_scale_is_told_from_nonfinite_gradients(kinds: list[float], scale: float, reason: str) -> None:
    guard = DivergenceGuard(max_skips=3, max_nonfinite_losses=10, min_scale=1.0)
    with pytest.raises(TrainerError) as info:
        guard.observe(_row(step, kind, scale=scale) for step, kind in enumerate(kinds, start=1))
    assert info.value.reason == reason


def test_without_a_dynamic_scaler_it_is_never_collapsed() -> None:
    guard = DivergenceGuard(max_skips=2, max_nonfinite_losses=10, min_scale=None)
    with pytest.raises(TrainerError) as info:
        guard.observe([_row(1, INF), _row(2, INF)])
    assert info.value.reason == "nonfinite_gradients"


def test_a_nan_earlier_in_the_run_survives_a_checkpoint() -> None:
    guard = DivergenceGuard(max_skips=3, max_nonfinite_losses=10, min_scale=1.0)
    guard.observe([_row(1, NAN, scale=1.0)])
    restored = DivergenceGuard(max_skips=3, max_nonfinite_losses=10, min_scale=1.0)
    restored.load_state_dict(guard.state_dict())
    with pytest.raises(TrainerError) as info:
        restored.observe([_row(2, INF, scale=1.0), _row(3, INF, scale=1.0)])
    assert info.value.reason == "nonfinite_gradients"
    older = DivergenceGuard(max_skips=3, max_nonfinite_losses=10)
    older.load_state_dict({"consecutive_skips": 1, "consecutive_nonfinite_losses": 0})  # pre-existing checkpoints
    assert older.state_dict()["nan_skips_in_run"] == 0


def test_unknown_reasons_are_refused() -> None:
    with pytest.raises(ValueError):
        TrainerError(cast(FailureReason, "oops"), "not a reason")  # deliberately not a FailureReason
    with pytest.raises(ValueError):
        DivergenceError(FailureReason.DATA_UNAVAILABLE, "a trainer error, but no divergence")


def test_the_guard_and_the_end_check_raise_divergence_errors() -> None:
    """The bf16 fallback catches exactly these (trainer.run.loop.train), by type."""
    failures = []
    cases: list[tuple[list[StepRow], tuple[int, int]]] = [
        ([_row(1, INF), _row(2, INF)], (2, 10)),
        ([_row(1, loss=math.nan)], (10, 1)),
    ]
    for rows, limits in cases:
        with pytest.raises(DivergenceError) as failure:
            DivergenceGuard(*limits).observe(rows)
        failures.append(failure.value.reason)
    with pytest.raises(DivergenceError) as failure:
        check_updates_applied(DivergenceGuard(50, 10), 5, 5)
    failures.append(failure.value.reason)
    assert failures == ["nonfinite_gradients", "nonfinite_loss", "no_update_applied"]
    assert set(failures) <= DIVERGENCE_REASONS and issubclass(DivergenceError, TrainerError)


def test_an_fp16_job_whose_gradients_overflow_at_min_scale_fails_as_collapsed(
    tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext, tmp_path: Path
) -> None:
    """+inf on every step: the scale backs off 2**4 -> 1 (min_scale) in 4 steps and keeps overflowing."""
    spec = tiny_mlp_spec(
        precision="fp16",
        loss_scale={"init_scale": 16.0},
        max_steps=40,
        max_consecutive_skips=8,
        log_interval=4,
        faults={"nonfinite_grad_steps": list(range(1, 41)), "nonfinite_value": "inf"},
    )
    with pytest.raises(TrainerError) as info:
        train(spec, tmp_path, cpu_ctx)
    assert info.value.reason == "loss_scale_collapsed" and "at step 8" in info.value.message
    steps = [r for r in json_records(tmp_path) if r["type"] == "step"]
    assert [s["loss_scale"] for s in steps] == [16.0, 8.0, 4.0, 2.0, 1.0, 1.0, 1.0, 1.0]
    assert all(s["overflow"] and s["grad_norm"] is None for s in steps)
