"""Field case C11 (NVIDIA/apex#715): the scale never reaches zero; a hopeless job fails."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from halfcast.contracts.spec import JobSpec
from trainer.errors import TrainerError
from trainer.parallel.distributed import DistContext
from trainer.records import RECORDS_FILE
from trainer.run.checkpoint import load_checkpoint, step_path
from trainer.run.loop import train


def test_nan_gradients_every_step_fail_the_job_long_before_the_end(
    tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext, tmp_path: Path
) -> None:
    """C11."""
    spec = tiny_mlp_spec(
        precision="fp16",
        loss_scale={"init_scale": 65536.0},
        max_steps=250,
        faults={"nonfinite_grad_steps": list(range(1, 251)), "nonfinite_value": "nan"},
    )
    with pytest.raises(TrainerError) as info:
        train(spec, tmp_path, cpu_ctx)
    assert info.value.reason == "nonfinite_gradients"

    lines = [json.loads(line) for line in (tmp_path / RECORDS_FILE).read_text().splitlines()]
    steps = [line for line in lines if line["type"] == "step"]
    assert len(steps) == spec.max_consecutive_skips < 250
    assert all(s["overflow"] and s["grad_norm"] is None for s in steps)
    scales = [s["loss_scale"] for s in steps]
    assert spec.effective_loss_scale is not None
    assert min(scales) == spec.effective_loss_scale.min_scale  # clamped, never 0 or subnormal
    assert scales[:3] == [65536.0, 32768.0, 16384.0]


def test_weights_never_receive_nan(tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext, tmp_path: Path) -> None:
    """C11: 12 NaN steps under a guard limit of 1000: the weights of step 12's checkpoint are finite; the job,
    having applied no update, fails ``no_update_applied`` (trainer/run/end_check.py) instead of succeeding."""
    spec = tiny_mlp_spec(
        precision="fp16",
        max_steps=12,
        max_consecutive_skips=1000,
        checkpoint_interval=12,
        faults={"nonfinite_grad_steps": list(range(1, 13)), "nonfinite_value": "nan"},
    )
    torch.manual_seed(spec.seed)
    with pytest.raises(TrainerError) as info:
        train(spec, tmp_path, cpu_ctx)
    assert info.value.reason == "no_update_applied"
    checkpoint = load_checkpoint(step_path(tmp_path, 12))
    assert checkpoint["precision"]["skipped_steps"] == 12
    assert all(torch.isfinite(t).all() for t in checkpoint["model"].values())
