"""``on_divergence: "fallback_bf16"``: rewind to the last healthy checkpoint (or step 0), go on in bf16 once.

Divergence is forced with fault injection limited to fp16 (``nonfinite_grad_precisions``),
so the bf16 continuation is clean; the references are independent bf16 jobs: one
from scratch, one resumed (through the ordinary resume path) from the healthy fp16
checkpoint with its precision state replaced by bf16's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from trainer_support import json_records, torchrun_trainer

from halfcast.contracts.spec import JobSpec
from trainer.data.base import IGNORE_INDEX, Batch
from trainer.errors import TrainerError
from trainer.parallel.distributed import DistContext
from trainer.run import loop
from trainer.run.checkpoint import final_path, load_checkpoint, step_path
from trainer.run.loop import TrainResult, train
from trainer.run.resume import check_resumable
from trainer.run.step import StepResult

SpecFactory = Callable[..., JobSpec]
CPU = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))

#: Overflows on steps 9-14 in fp16 only; the scale 2 -> 1 (min_scale) -> 1 -> 1: four skips
#: in a row trip the guard at step 12 (log_interval 2: the flush after step 12), the run
#: began at step 9, so the healthy checkpoint is step 8 (checkpoint_interval 4).
FALLBACK: dict[str, Any] = {
    "precision": "fp16",
    "loss_scale": {"init_scale": 2.0},
    "on_divergence": "fallback_bf16",
    "max_steps": 16,
    "log_interval": 2,
    "checkpoint_interval": 4,
    "max_consecutive_skips": 4,
    "optimizer": {"lr": 0.01},
    "lr_scheduler": {"name": "cosine", "warmup_steps": 2},
    "faults": {"nonfinite_grad_steps": list(range(9, 15)), "nonfinite_grad_precisions": ["fp16"]},
}


@pytest.fixture(scope="module")
def fell_back(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, TrainResult]]:
    """The FALLBACK job (the tiny MLP of the trainer fixtures), run once for the module."""
    spec = JobSpec.model_validate(
        {
            "model": {"name": "mlp", "config": {"hidden_sizes": [32]}},
            "dataset": {"name": "synthetic", "config": {"in_features": 16, "num_samples": 256, "seed": 3}},
            "micro_batch_size": 16,
            "seed": 0,
            **FALLBACK,
        }
    )
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    run_dir = tmp_path_factory.mktemp("fallback")
    try:
        result = train(spec, run_dir, CPU)
    finally:
        torch.set_num_threads(before)
    yield run_dir, result


def _steps(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] == "step"]


def _switches(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] == "precision_switch"]


def _deduplicated(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Step records by step, a later line replacing an earlier one (what the worker stores)."""
    return {r["step"]: r for r in _steps(records)}


def _params_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_the_guard_trips_in_fp16_and_the_job_finishes_in_bf16(fell_back: tuple[Path, TrainResult]) -> None:
    run_dir, result = fell_back
    records = json_records(run_dir)
    assert result.steps == 16 and records[-1]["type"] == "end"
    [switch] = _switches(records)
    assert {k: switch[k] for k in ("step", "from", "to", "reason", "rewound_to_step")} == {
        "step": 12,
        "from": "fp16",
        "to": "bf16",
        "reason": "loss_scale_collapsed",
        "rewound_to_step": 8,
    }
    assert "at step 12" in switch["message"]
    at = records.index(switch)
    before, after = _steps(records[:at]), _steps(records[at:])
    assert [s["step"] for s in before] == list(range(1, 13)) and all("precision" not in s for s in before)
    assert [s["step"] for s in after] == list(range(9, 17))
    assert all(s["precision"] == "bf16" and s["loss_scale"] == 1.0 and not s["overflow"] for s in after)
    assert list(_deduplicated(records)) == list(range(1, 17))
    assert after[0]["skipped_steps"] == before[7]["skipped_steps"] == 0  # the counter carries over from step 8


def test_checkpoints_after_the_switch_are_bf16_and_record_it(fell_back: tuple[Path, TrainResult]) -> None:
    run_dir, _ = fell_back
    healthy = load_checkpoint(step_path(run_dir, 8))
    assert healthy["precision"]["precision"] == "fp16" and "precision_switch" not in healthy
    for path in (step_path(run_dir, 12), step_path(run_dir, 16), final_path(run_dir)):
        payload = load_checkpoint(path)
        assert payload["precision"]["precision"] == "bf16"
        assert payload["precision_switch"]["rewound_to_step"] == 8
        assert payload["spec"]["precision"] == "fp16"  # the spec stays what the user asked


def test_the_continuation_equals_a_bf16_job_resumed_from_the_healthy_checkpoint(
    fell_back: tuple[Path, TrainResult], tiny_mlp_spec: SpecFactory, tmp_path: Path
) -> None:
    """Reference: the ordinary resume path of a plain bf16 job, from step 8's fp16 state (scaler dropped)."""
    run_dir, result = fell_back
    bf16 = tiny_mlp_spec(**(FALLBACK | {"precision": "bf16", "loss_scale": None, "on_divergence": "fail"}))
    payload = load_checkpoint(step_path(run_dir, 8))
    payload["precision"] = {
        "precision": "bf16",
        "scaler": {"kind": "NoOpLossScaler", "scale": 1.0},
        "skipped_steps": payload["precision"]["skipped_steps"],
        "empty_windows": 0,  # what load_checkpoint reads where a checkpoint has none
    }
    payload["spec"] = bf16.model_dump(mode="json")
    converted = tmp_path / "converted.pt"
    torch.save(payload, converted)

    reference = train(bf16, tmp_path / "reference", CPU, resume_from=converted)

    assert _params_equal(result.model, reference.model)
    ours = [(s["step"], s["loss"], s["grad_norm"], s["lr"]) for s in _steps(json_records(run_dir))[-8:]]
    theirs = [(s["step"], s["loss"], s["grad_norm"], s["lr"]) for s in _steps(json_records(tmp_path / "reference"))]
    assert ours == theirs


def test_empty_windows_before_the_switch_still_count_after_it(
    tiny_mlp_spec: SpecFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The FALLBACK job on classification, with the windows of steps 3 and 6 (before the healthy step-8
    checkpoint) and 15 (in bf16) holding no supervised target: the bf16 continuation restores the
    empty-window count from step 8 with the skipped-step count, so the end record counts all three and
    ``applied_steps`` is the schedule's applied-step count (``steps`` = applied + skipped + empty)."""
    empty_steps = {3, 6, 15}
    original = loop.train_step

    def train_step(parts: Any, micro_batches: Sequence[Batch], *, step: int, **options: Any) -> StepResult:
        if step in empty_steps:  # every target ignored: a window without a loss-bearing element
            micro_batches = [
                dataclasses.replace(b, targets=torch.full_like(b.targets, IGNORE_INDEX), num_elements=0)
                for b in micro_batches
            ]
        return original(parts, micro_batches, step=step, **options)

    monkeypatch.setattr(loop, "train_step", train_step)
    dataset = {"name": "synthetic", "config": {"task": "classification", "num_samples": 256, "num_classes": 4}}
    result = train(tiny_mlp_spec(**FALLBACK, dataset=dataset), tmp_path, CPU)

    records = json_records(tmp_path)
    [switch] = _switches(records)
    assert (switch["step"], switch["rewound_to_step"]) == (12, 8)
    end = records[-1]
    assert end["type"] == "end"
    assert (end["steps"], end["skipped_steps"], end.get("empty_windows"), end["applied_steps"]) == (16, 0, 3, 13)
    assert (result.steps, result.skipped_steps, result.empty_windows, result.applied_steps) == (16, 0, 3, 13)
    final = load_checkpoint(final_path(tmp_path))
    assert end["applied_steps"] == final["lr_scheduler"]["last_epoch"]  # the schedule advanced on applied steps only
    assert load_checkpoint(step_path(tmp_path, 8))["precision"]["empty_windows"] == 2  # steps 3 and 6, in fp16
    assert load_checkpoint(step_path(tmp_path, 12))["precision"]["empty_windows"] == 2  # bf16, carried over
    assert final["precision"]["empty_windows"] == 3


def test_a_job_resumed_after_the_switch_continues_in_bf16(
    fell_back: tuple[Path, TrainResult], tiny_mlp_spec: SpecFactory, tmp_path: Path
) -> None:
    run_dir, result = fell_back
    resumed = train(tiny_mlp_spec(**FALLBACK), tmp_path, CPU, resume_from=step_path(run_dir, 12))
    records = json_records(tmp_path)
    start = next(r for r in records if r["type"] == "start")
    assert start["precision"] == "bf16" and start["precision_switch"]["rewound_to_step"] == 8
    assert not _switches(records)
    assert [s["precision"] for s in _steps(records)] == ["bf16"] * 4
    assert _params_equal(result.model, resumed.model)


def test_a_switched_checkpoint_is_refused_without_the_fallback(
    fell_back: tuple[Path, TrainResult], tiny_mlp_spec: SpecFactory
) -> None:
    run_dir, _ = fell_back
    path = step_path(run_dir, 12)
    with pytest.raises(TrainerError) as info:
        check_resumable(load_checkpoint(path), tiny_mlp_spec(**(FALLBACK | {"on_divergence": "fail"})), path)
    assert info.value.reason == "spec_invalid" and "fallback_bf16" in info.value.message
    assert check_resumable(load_checkpoint(path), tiny_mlp_spec(**FALLBACK), path) == 12


def test_without_a_healthy_checkpoint_the_job_restarts_in_bf16_like_a_bf16_job(
    tiny_mlp_spec: SpecFactory, cpu_ctx: DistContext, tmp_path: Path
) -> None:
    """Overflows from step 3 trip the guard at step 5; the only checkpoint (step 4) is inside the run."""
    spec = tiny_mlp_spec(
        **(
            FALLBACK
            | {
                "max_steps": 8,
                "loss_scale": None,
                "max_consecutive_skips": 3,
                "log_interval": 4,
                "faults": {"nonfinite_grad_steps": [3, 4, 5, 6], "nonfinite_grad_precisions": ["fp16"]},
            }
        )
    )
    result = train(spec, tmp_path / "fallback", cpu_ctx)
    reference = train(
        tiny_mlp_spec(
            precision="bf16", max_steps=8, optimizer={"lr": 0.01}, lr_scheduler={"name": "cosine", "warmup_steps": 2}
        ),
        tmp_path / "bf16",
        cpu_ctx,
    )

    records = json_records(tmp_path / "fallback")
    [switch] = _switches(records)
    assert (switch["step"], switch["rewound_to_step"], switch["reason"]) == (5, 0, "nonfinite_gradients")
    # step 4's fp16 checkpoint was deleted at the switch; the bf16 run wrote its own
    assert load_checkpoint(step_path(tmp_path / "fallback", 4))["precision"]["precision"] == "bf16"
    assert [s["step"] for s in _steps(records[records.index(switch) :])] == list(range(1, 9))
    assert _params_equal(result.model, reference.model)


def test_with_on_divergence_fail_the_job_still_fails(
    tiny_mlp_spec: SpecFactory, cpu_ctx: DistContext, tmp_path: Path
) -> None:
    with pytest.raises(TrainerError) as info:
        train(tiny_mlp_spec(**(FALLBACK | {"on_divergence": "fail"})), tmp_path, cpu_ctx)
    assert info.value.reason == "loss_scale_collapsed"
    records = json_records(tmp_path)
    assert not _switches(records) and _steps(records)[-1]["step"] == 12


def test_a_bf16_divergence_after_the_switch_fails_the_job(
    tiny_mlp_spec: SpecFactory, cpu_ctx: DistContext, tmp_path: Path
) -> None:
    """Faults in every precision: bf16 skips the same steps, and the guard fails it (one switch only)."""
    spec = tiny_mlp_spec(**(FALLBACK | {"faults": {"nonfinite_grad_steps": list(range(9, 15))}}))
    with pytest.raises(TrainerError) as info:
        train(spec, tmp_path, cpu_ctx)
    assert info.value.reason == "nonfinite_gradients"  # no dynamic scaler in bf16
    records = json_records(tmp_path)
    assert len(_switches(records)) == 1
    last = _steps(records)[-1]
    assert (last["step"], last["precision"], last["overflow"]) == (12, "bf16", True)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fallback_bf16_needs_fp16(tiny_mlp_spec: SpecFactory, precision: str) -> None:
    with pytest.raises(ValidationError) as info:
        tiny_mlp_spec(precision=precision, on_divergence="fallback_bf16")
    assert [e["loc"] for e in info.value.errors()] == [("on_divergence",)]
    assert tiny_mlp_spec(precision=precision).on_divergence == "fail"
    with pytest.raises(ValidationError):
        tiny_mlp_spec(precision="fp16", on_divergence="bf16")


@pytest.mark.slow
def test_two_ranks_fall_back_in_lockstep(tmp_path: Path) -> None:
    """torchrun, 2 gloo ranks, K=2, DDP: the overflow (rank 1 only) trips both ranks' guards at the same
    flush; both rewind to step 8, rebuild in bf16 (DDP's broadcast and every later collective matched)
    and finish with bit-identical parameters."""
    spec = {
        "model": {"name": "mlp", "config": {"hidden_sizes": [16]}},
        "dataset": {"name": "synthetic", "config": {"task": "classification", "num_samples": 256, "num_classes": 4}},
        "processes": 2,
        "micro_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "eval_interval": 6,
        **FALLBACK,
        "faults": {**FALLBACK["faults"], "ranks": [1]},
    }
    done, run_dir = torchrun_trainer(spec, tmp_path, env={"HALFCAST_DUMP_PARAMS": "1"}, timeout_s=300)
    assert done.returncode == 0, done.stderr[-4000:]

    records = json_records(run_dir)
    [switch] = _switches(records)
    assert (switch["step"], switch["rewound_to_step"]) == (12, 8)
    assert list(_deduplicated(records)) == list(range(1, 17)) and records[-1]["type"] == "end"
    assert all(s.get("precision") == "bf16" for s in _steps(records[records.index(switch) :]))
    params = [torch.load(run_dir / f"params-rank{r}.pt") for r in range(2)]
    assert all(torch.equal(params[0][k], params[1][k]) for k in params[0])
    assert not (run_dir / "error.json").exists()


def test_the_guard_knows_where_the_failing_run_began() -> None:
    from trainer.run.guard import DivergenceGuard
    from trainer.run.telemetry import StepRow

    def row(step: int, overflow: bool, loss: float = 1.0) -> StepRow:
        return StepRow(
            step=step,
            time=0.0,
            loss=loss,
            loss_scale=1.0,
            overflow_kind=float(overflow),
            skipped_steps=0,
            grad_norm=1.0,
            lr=0.1,
            samples=1,
            tokens=None,
        )

    guard = DivergenceGuard(max_skips=3, max_nonfinite_losses=2)
    guard.observe([row(1, False), row(2, True), row(3, False), row(4, True), row(5, True)])
    assert guard.failing_run_start == 4
    with pytest.raises(TrainerError):
        guard.observe([row(6, True, float("nan"))])
    assert (guard.last_step, guard.failing_run_start) == (6, 4)
