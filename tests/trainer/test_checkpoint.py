"""Checkpoints hold model, optimizer, scheduler, precision state and step; they are written atomically."""

from __future__ import annotations

from pathlib import Path
from typing import IO

import pytest
import torch

from halfcast.contracts.spec import JobSpec
from trainer.components import build_components
from trainer.parallel.distributed import DistContext
from trainer.run import checkpoint
from trainer.run.checkpoint import final_path, load_checkpoint, save_checkpoint, step_path
from trainer.run.loop import train


def test_final_checkpoint_holds_everything_to_resume(cpu_ctx: DistContext, tmp_path: Path, tiny_mlp_spec) -> None:
    spec = tiny_mlp_spec(
        precision="fp16",
        loss_scale={"init_scale": 1024, "growth_interval": 2},
        optimizer={"name": "adamw", "lr": 0.01},
        lr_scheduler={"name": "cosine"},
        max_steps=3,
        checkpoint_interval=2,
    )
    result = train(spec, tmp_path, cpu_ctx)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["final.pt", "step-2.pt"]
    saved = load_checkpoint(final_path(tmp_path))
    assert set(saved) == {
        "model",
        "optimizer",
        "lr_scheduler",
        "precision",
        "step",
        "counters",
        "spec",
        "rng",
        "data_info",
        "best_evaluation",
        "inputs",
    }
    assert saved["inputs"] == {}  # a built-in dataset and model read no input files
    assert saved["data_info"] == {
        "task": "regression",
        "num_outputs": 1,
        "in_features": 16,
        "seq_len": None,
        "label_names": None,
    }
    assert len(saved["rng"]) == 1 and set(saved["rng"][0]) >= {"python", "torch"}
    assert saved["step"] == 3 and load_checkpoint(step_path(tmp_path, 2))["step"] == 2
    assert JobSpec.model_validate(saved["spec"]) == spec
    assert saved["counters"] == {
        "consecutive_skips": 0,
        "consecutive_nonfinite_losses": 0,
        "nan_skips_in_run": 0,
        "samples_total": 3 * 16,
        "tokens_total": 0,
    }
    assert saved["precision"]["precision"] == "fp16"
    assert saved["precision"]["scaler"]["scale"] == 2048.0  # grew once after 2 clean steps
    assert saved["lr_scheduler"]["last_epoch"] == 3
    assert all(torch.equal(saved["model"][k], v) for k, v in result.model.state_dict().items())

    fresh = build_components(spec, cpu_ctx)
    load_checkpoint(final_path(tmp_path), fresh.training_state)
    assert all(torch.equal(fresh.model.state_dict()[k], v) for k, v in saved["model"].items())
    assert fresh.lr_scheduler.last_epoch == 3
    assert fresh.precision.state_dict() == saved["precision"]
    assert int(fresh.optimizer.state_dict()["state"][0]["step"]) == 3


def test_a_failed_save_leaves_no_file(
    cpu_ctx: DistContext, tmp_path: Path, tiny_mlp_spec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save that fails half-way leaves the previous checkpoint intact and no temporary file."""
    parts = build_components(tiny_mlp_spec(), cpu_ctx)
    target = tmp_path / "checkpoints" / "final.pt"
    save_checkpoint(target, parts.training_state, step=1, counters={}, spec=tiny_mlp_spec())
    before = target.read_bytes()

    def broken_save(obj: object, handle: IO[bytes]) -> None:
        handle.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(target, parts.training_state, step=2, counters={}, spec=tiny_mlp_spec())
    assert target.read_bytes() == before
    assert [p.name for p in target.parent.iterdir()] == ["final.pt"]


def test_a_checkpoint_from_before_empty_windows_were_counted_loads_with_none(
    cpu_ctx: DistContext, tmp_path: Path, tiny_mlp_spec
) -> None:
    """Older checkpoints' precision state has no ``empty_windows``: it loads (and restores) as 0, so the
    bf16 fallback and a resume read every checkpoint alike."""
    spec = tiny_mlp_spec(max_steps=2)
    train(spec, tmp_path, cpu_ctx)
    payload = torch.load(final_path(tmp_path), weights_only=True)
    del payload["precision"]["empty_windows"]
    older = tmp_path / "older.pt"
    torch.save(payload, older)

    fresh = build_components(spec, cpu_ctx)
    assert load_checkpoint(older, fresh.training_state)["precision"]["empty_windows"] == 0
    assert fresh.precision.state_dict()["empty_windows"] == 0
