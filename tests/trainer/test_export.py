"""``trainer.export.load_trained_model``: a checkpoint's trained model, rebuilt for inference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from halfcast.contracts.spec import JobSpec
from trainer.data.base import DataInfo, Task
from trainer.export import DATA_INFO_KEY, checkpoint_data_info, data_info_entry, load_trained_model
from trainer.parallel.distributed import DistContext
from trainer.run.checkpoint import final_path
from trainer.run.loop import train


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_final_checkpoint_rebuilds_the_trained_mlp(
    cpu_ctx: DistContext, tmp_path: Path, tiny_mlp_spec: Any
) -> None:
    result = train(tiny_mlp_spec(precision="bf16", max_steps=3), tmp_path, cpu_ctx)
    model = load_trained_model(final_path(tmp_path))
    assert _same_weights(model, result.model) and not model.training
    assert all(p.dtype == torch.float32 for p in model.parameters())
    inputs = torch.randn(5, 16)
    result.model.eval()
    assert torch.equal(model(inputs), result.model(inputs))


def test_a_gpt_trained_on_text_comes_back_with_its_context_length(cpu_ctx: DistContext, tmp_path: Path) -> None:
    spec = JobSpec.model_validate(
        {
            "model": {"name": "gpt", "config": {"n_layer": 1, "n_head": 2, "d_model": 16}},
            "dataset": {"name": "text", "config": {"seq_len": 8, "max_bytes": 4096}},
            "micro_batch_size": 2,
            "max_steps": 2,
            "seed": 0,
        }
    )
    result = train(spec, tmp_path, cpu_ctx)
    payload = torch.load(final_path(tmp_path), weights_only=True)
    assert payload["data_info"]["task"] == "lm" and payload["data_info"]["seq_len"] == 8
    model = load_trained_model(final_path(tmp_path))
    assert _same_weights(model, result.model)
    tokens = torch.randint(0, payload["data_info"]["num_outputs"], (1, 8))
    result.model.eval()
    assert torch.equal(model(tokens), result.model(tokens))


def test_a_checkpoint_from_before_data_info_gets_the_sizes_from_its_dataset(
    cpu_ctx: DistContext, tmp_path: Path, tiny_mlp_spec: Any
) -> None:
    result = train(tiny_mlp_spec(max_steps=2), tmp_path, cpu_ctx)
    old = tmp_path / "old.pt"
    payload = torch.load(final_path(tmp_path), weights_only=True)
    del payload["data_info"]
    torch.save(payload, old)
    assert _same_weights(load_trained_model(old), result.model)


def test_weights_that_do_not_fit_the_spec_are_refused(cpu_ctx: DistContext, tmp_path: Path, tiny_mlp_spec: Any) -> None:
    train(tiny_mlp_spec(max_steps=1), tmp_path, cpu_ctx)
    payload = torch.load(final_path(tmp_path), weights_only=True)
    payload["spec"]["model"]["config"]["hidden_sizes"] = [64]
    bad = tmp_path / "bad.pt"
    torch.save(payload, bad)
    with pytest.raises(RuntimeError, match="size mismatch"):
        load_trained_model(bad)


def test_the_data_info_entry_is_plain_data() -> None:
    entry = data_info_entry(DataInfo(task=Task.CLASSIFICATION, num_outputs=10, in_features=64))
    assert entry == {
        "task": "classification",
        "num_outputs": 10,
        "in_features": 64,
        "seq_len": None,
        "label_names": None,
    }
    assert type(entry["task"]) is str  # a StrEnum would not load with weights_only=True


def test_label_names_survive_a_checkpoint_loaded_with_weights_only(tmp_path: Path) -> None:
    info = DataInfo(Task.CLASSIFICATION, 2, seq_len=16, label_names=("negative", "positive"))
    torch.save({DATA_INFO_KEY: data_info_entry(info)}, tmp_path / "c.pt")
    assert checkpoint_data_info(torch.load(tmp_path / "c.pt", weights_only=True)) == info
