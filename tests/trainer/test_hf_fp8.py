"""fp8 with LoRA on an hf model (emulated fp8 Linears on the CPU): the frozen base Linears the adapters
wrap run in fp8, adapter factors and heads stay in bf16, the job trains, an fp8 overflow skips the step,
and the exports are plain Hugging Face models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hf_support import lora_spec
from trainer_support import json_records

from halfcast.contracts.spec import JobSpec
from trainer.numerics import precision
from trainer.numerics.fp8 import Float8EmulatedLinear
from trainer.parallel.distributed import DistContext
from trainer.run import loop


def _fp8_job(tmp_path: Path, cpu_ctx: DistContext, monkeypatch: pytest.MonkeyPatch, **overrides: Any) -> Any:
    """Train an fp8 LoRA job on the CPU: the CUDA check is lifted, so the policy emulates fp8 layers."""
    monkeypatch.setattr(precision, "check_supported", lambda name, device: None)
    fields = {
        "precision": "fp8",
        "gpus": 1,
        "adapter": {"r": 16, "alpha": 16, "target_modules": "all-linear"},
        "max_steps": 3,
        "log_interval": 1,
        **overrides,
    }
    built: list[Any] = []
    build = loop.build_components

    def capture(*args: Any, **kwargs: Any) -> Any:
        built.append(build(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(loop, "build_components", capture)
    result = loop.train(JobSpec.model_validate(lora_spec(**fields)), tmp_path, cpu_ctx)
    return result, built[-1], json_records(tmp_path)


def test_fp8_converts_the_frozen_base_linears_and_keeps_adapters_in_bf16(
    model_roots: Path, tmp_path: Path, cpu_ctx: DistContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, parts, records = _fp8_job(tmp_path, cpu_ctx, monkeypatch)
    layers = parts.precision.fp8_layers
    assert layers and all(name.endswith(".base_layer") for name in layers)  # r=16 factors would be eligible
    fp8_modules = [n for n, m in result.model.named_modules() if isinstance(m, Float8EmulatedLinear)]
    assert fp8_modules == layers and not any(".lora_" in n for n in fp8_modules)
    for name in layers:
        assert not any(p.requires_grad for p in result.model.get_submodule(name).parameters())
    assert all(p.dtype == torch.bfloat16 for n, p in result.model.named_parameters() if n.endswith("base_layer.weight"))
    steps = [r for r in records if r["type"] == "step"]
    assert len(steps) == 3 and not any(s["overflow"] for s in steps)
    end = records[-1]
    assert end["type"] == "end" and end["steps"] == 3 and end["skipped_steps"] == 0
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "export" / "model"), local_files_only=True)
    assert all(type(m) is not Float8EmulatedLinear for m in merged.modules())  # a plain model, no Halfcast code


def test_an_fp8_overflow_in_a_base_layer_skips_the_adapter_step(
    model_roots: Path, tmp_path: Path, cpu_ctx: DistContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    fired: list[int] = []
    forward = Float8EmulatedLinear.forward
    calls: dict[int, int] = {}  # forward calls, by layer (id)

    def overflow_on_second_step(self: Float8EmulatedLinear, x: torch.Tensor) -> torch.Tensor:
        out = forward(self, x)
        if self.training and len(fired) < 1 and calls.get(id(self), 0) == 1:
            self.overflow.record(torch.tensor(1.0))
            fired.append(1)
        calls[id(self)] = calls.get(id(self), 0) + 1
        return out

    monkeypatch.setattr(Float8EmulatedLinear, "forward", overflow_on_second_step)
    _, _, records = _fp8_job(tmp_path, cpu_ctx, monkeypatch)
    steps = [r for r in records if r["type"] == "step"]
    assert fired and [s["overflow"] for s in steps] == [False, True, False]
