"""Ranks, devices and process groups; a real two-rank torchrun job."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_support import TORCHRUN_ENV, json_records, torchrun_trainer

from halfcast.contracts.spec import JobSpec
from trainer.errors import TrainerError
from trainer.parallel.distributed import distributed_session, env_ranks, init_distributed, select_device


@pytest.fixture
def no_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)


def _spec(**fields: object) -> JobSpec:
    return JobSpec.model_validate({"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, **fields})


def test_single_process_without_torchrun(no_torchrun_env: None) -> None:
    assert env_ranks() == (0, 0, 1)
    with distributed_session(_spec()) as ctx:
        assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.is_distributed) == (0, 1, True, False)
        assert ctx.device == torch.device("cpu")


def test_ranks_from_the_torchrun_environment(no_torchrun_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert env_ranks() == (3, 1, 4)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(TrainerError) as info:
        env_ranks()
    assert info.value.reason == "launch_failed"


def test_world_size_must_match_the_spec(no_torchrun_env: None) -> None:
    with pytest.raises(TrainerError) as info:
        init_distributed(_spec(processes=2))
    assert info.value.reason == "launch_failed"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_gpus_without_cuda_is_gpu_unavailable() -> None:
    assert select_device(0, 0) == torch.device("cpu")
    with pytest.raises(TrainerError) as info:
        select_device(1, 0)
    assert info.value.reason == "gpu_unavailable"


@pytest.mark.slow
def test_two_rank_torchrun_job_keeps_ranks_identical(tmp_path: Path) -> None:
    """processes 2, K=2, fp16 with an overflow injected on rank 1 only at step 2.

    The job succeeds; records.jsonl has start, step, eval and end lines; both ranks
    skipped step 2 together; the final parameters are bit-identical across ranks.
    """
    spec = {
        "model": {"name": "mlp", "config": {"hidden_sizes": [16]}},
        "dataset": {"name": "synthetic", "config": {"task": "classification", "num_samples": 256, "num_classes": 4}},
        "precision": "fp16",
        "loss_scale": {"init_scale": 1024},
        "processes": 2,
        "micro_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "max_steps": 6,
        "eval_interval": 3,
        "faults": {"nonfinite_grad_steps": [2], "ranks": [1]},
    }
    done, run_dir = torchrun_trainer(spec, tmp_path, env={"HALFCAST_DUMP_PARAMS": "1"})
    assert done.returncode == 0, done.stderr[-4000:]

    records = [r for r in json_records(run_dir) if r["type"] != "phase"]  # start-up phases: test_startup.py
    assert [r["type"] for r in records] == ["start"] + ["step"] * 3 + ["eval"] + ["step"] * 3 + ["eval", "end"]
    assert records[0]["world_size"] == 2 and records[0]["global_batch_size"] == 32
    steps = [r for r in records if r["type"] == "step"]
    assert [s["overflow"] for s in steps] == [False, True, False, False, False, False]
    assert steps[2]["loss_scale"] == 512.0
    assert steps[1]["overflow_ranks"] == [1] and steps[1]["nonfinite_param_count"] == 1  # forensics: rank 1 only
    assert records[-1]["skipped_steps"] == 1
    params = [torch.load(run_dir / f"params-rank{r}.pt") for r in range(2)]
    assert params[0].keys() == params[1].keys()
    assert all(torch.equal(params[0][k], params[1][k]) for k in params[0])
    assert not (run_dir / "error.json").exists()
