"""SIGTERM stops a run gracefully: every rank agrees, records and a checkpoint are written, resume is exact."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from trainer_support import json_records, torchrun_trainer

from halfcast.contracts.spec import JobSpec
from trainer.parallel.distributed import DistContext
from trainer.preemption import StopRequested, StopSignal
from trainer.run.checkpoint import step_path
from trainer.run.loop import train


@pytest.fixture
def stop() -> Iterator[StopSignal]:
    signal_ = StopSignal().install()
    try:
        yield signal_
    finally:
        signal_.restore()


def _spec(tiny_mlp_spec: Callable[..., JobSpec], **faults: object) -> JobSpec:
    return tiny_mlp_spec(
        precision="fp16",
        max_steps=8,
        log_interval=10,
        loss_scale={"init_scale": 1024.0},
        faults={"nonfinite_grad_steps": [2], **faults},
    )


def test_sigterm_checkpoints_the_last_step_and_the_resume_is_exact(
    tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext, tmp_path: Path, stop: StopSignal
) -> None:
    """SIGTERM before step 4: step 4 completes, its records and checkpoint are written, then the run stops;
    resuming from that checkpoint ends with the parameters and records of an uninterrupted run."""
    interrupted = _spec(tiny_mlp_spec, kill_at_step={"step": 4, "rank": 0, "signal": "SIGTERM"})
    with pytest.raises(StopRequested) as info:
        train(interrupted, tmp_path / "a", cpu_ctx, stop=stop)
    assert info.value.step == 4 and stop.received
    assert [r["step"] for r in json_records(tmp_path / "a") if r["type"] == "step"] == [1, 2, 3, 4]
    assert step_path(tmp_path / "a", 4).is_file()

    resumed = train(_spec(tiny_mlp_spec), tmp_path / "a", cpu_ctx, resume_from=step_path(tmp_path / "a", 4))
    whole = train(_spec(tiny_mlp_spec), tmp_path / "b", cpu_ctx)
    for a, b in zip(resumed.model.state_dict().values(), whole.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    steps = {r["step"]: r for r in json_records(tmp_path / "a") if r["type"] == "step"}
    reference = {r["step"]: r for r in json_records(tmp_path / "b") if r["type"] == "step"}
    for step in range(1, 9):
        assert {k: steps[step][k] for k in ("loss", "loss_scale", "samples_total")} == {
            k: reference[step][k] for k in ("loss", "loss_scale", "samples_total")
        }


def test_without_a_signal_the_run_finishes(
    tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext, tmp_path: Path, stop: StopSignal
) -> None:
    assert train(_spec(tiny_mlp_spec), tmp_path, cpu_ctx, stop=stop).steps == 8 and not stop.received


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_both_at_the_same_step(tmp_path: Path) -> None:
    """torchrun, 2 gloo ranks; only rank 1 gets SIGTERM (before step 3): both checkpoint step 3 and exit 143."""
    spec = {
        "model": {"name": "mlp", "config": {"hidden_sizes": [16]}},
        "dataset": {"name": "synthetic", "config": {"num_samples": 256}},
        "processes": 2,
        "micro_batch_size": 8,
        "max_steps": 50,
        "log_interval": 10,
        "faults": {"kill_at_step": {"step": 3, "rank": 1, "signal": "SIGTERM"}},
    }
    done, run_dir = torchrun_trainer(spec, tmp_path)
    assert done.returncode != 0, done.stderr[-3000:]
    assert done.stderr.count("stopped by SIGTERM after step 3") == 2, done.stderr[-3000:]
    assert [r["step"] for r in json_records(run_dir) if r["type"] == "step"] == [1, 2, 3]
    assert step_path(tmp_path / "run", 3).is_file() and not (tmp_path / "run" / "error.json").exists()
