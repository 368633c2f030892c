"""Field case C08 (huggingface/accelerate#4289, facebookresearch/metaseq#3): exact resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.records import RECORDS_FILE
from trainer.run.checkpoint import final_path, load_checkpoint, step_path

pytestmark = pytest.mark.slow  # runs the trainer in fresh interpreters: not in make check

SPEC: dict[str, Any] = {
    "model": {"name": "mlp", "config": {"hidden_sizes": [32], "dropout": 0.1}},
    "dataset": {"name": "synthetic", "config": {"in_features": 16, "num_samples": 96, "seed": 3}},
    "precision": "fp16",
    "loss_scale": {"init_scale": 1024.0, "growth_interval": 2},
    "optimizer": {"name": "adamw", "lr": 0.01},
    "lr_scheduler": {"name": "cosine", "warmup_steps": 2},
    "micro_batch_size": 16,
    "gradient_accumulation_steps": 2,
    "max_steps": 10,
    "checkpoint_interval": 5,
    "faults": {"nonfinite_grad_steps": [3, 7]},
}


def _run(run_dir: Path, spec: dict[str, Any], *extra: str) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HALFCAST_ALLOW_FAULTS": "1"}  # the spec injects overflows
    cmd = [sys.executable, "-m", "trainer", "--spec", str(run_dir / "spec.json"), "--run-dir", str(run_dir), *extra]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:  # the trainer's own error, not pytest's summary of the command
        raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr[-3000:])


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in (run_dir / RECORDS_FILE).read_text().splitlines()]
    return [line for line in lines if line["type"] == "step"]


def _trajectory(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (r["step"], r["loss"], r["loss_scale"], r["overflow"], r["skipped_steps"], r["grad_norm"], r["lr"])
        for r in records
    ]


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted 10-step run with a checkpoint after step 5."""
    run_dir = tmp_path_factory.mktemp("c08") / "whole"
    _run(run_dir, SPEC)
    return run_dir


def test_resume_in_a_new_process_is_bit_identical(whole: Path, tmp_path: Path) -> None:
    """C08."""
    resumed = tmp_path / "resumed"
    checkpoint = step_path(whole, 5)
    _run(resumed, SPEC, "--resume-from", str(checkpoint))

    expected = [r for r in _steps(whole) if r["step"] > 5]
    assert _trajectory(_steps(resumed)) == _trajectory(expected)
    assert [r["overflow"] for r in expected] == [False, True, False, False, False]
    final_whole, final_resumed = load_checkpoint(final_path(whole)), load_checkpoint(final_path(resumed))
    for name, value in final_whole["model"].items():
        assert torch.equal(value, final_resumed["model"][name]), name
    assert final_whole["precision"] == final_resumed["precision"]
    assert final_whole["lr_scheduler"] == final_resumed["lr_scheduler"]


def test_restored_scaler_state_equals_the_saved_one(whole: Path, tmp_path: Path) -> None:
    """C08."""
    resumed = tmp_path / "resumed"
    saved = load_checkpoint(step_path(whole, 5))["precision"]
    short = SPEC | {"max_steps": 6, "checkpoint_interval": None}
    _run(resumed, short, "--resume-from", str(step_path(whole, 5)))
    first = _steps(resumed)[0]
    assert first["step"] == 6
    assert first["loss_scale"] == saved["scaler"]["scale"]
    assert first["skipped_steps"] - int(first["overflow"]) == saved["skipped_steps"]


@pytest.mark.parametrize("change", [{"precision": "bf16", "loss_scale": None}, {"seed": 1}, {"micro_batch_size": 8}])
def test_resume_refuses_a_spec_that_changes_the_trajectory(whole: Path, tmp_path: Path, change: dict[str, Any]) -> None:
    other = tmp_path / "other"
    with pytest.raises(subprocess.CalledProcessError):
        _run(other, SPEC | change, "--resume-from", str(step_path(whole, 5)))
    error = json.loads((other / "error.json").read_text())
    assert error["reason"] == "spec_invalid"
