"""``compile: true``: compiled and eager training agree, the start record has the compile time, the
warm-up leaves no trace, and the combinations that do not compile are rejected naming ``compile``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from torch import nn
from trainer_support import json_records

from halfcast.contracts.spec import JobSpec
from trainer.data.base import Batch
from trainer.model_compile import warm_up
from trainer.numerics.precision import PlainPrecision
from trainer.parallel.distributed import DistContext
from trainer.run.loop import train


@pytest.mark.slow
def test_compiled_training_matches_eager_and_reports_its_compile_time(
    tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext, tmp_path: Path
) -> None:
    """fp16 with loss scaling, 4 steps: the same losses (within float tolerance), ``compile_s`` only when compiled."""
    runs = {}
    for compiled in (False, True):
        run_dir = tmp_path / str(compiled)
        train(tiny_mlp_spec(precision="fp16", max_grad_norm=1.0, compile=compiled), run_dir, cpu_ctx)
        runs[compiled] = json_records(run_dir)
    eager, compiled_run = ([r["loss"] for r in runs[c] if r["type"] == "step"] for c in (False, True))
    assert len(eager) == 4 and compiled_run == pytest.approx(eager, rel=1e-5, abs=1e-6)
    [start_eager] = [r for r in runs[False] if r["type"] == "start"]
    [start_compiled] = [r for r in runs[True] if r["type"] == "start"]
    assert "compile_s" not in start_eager and start_compiled["compile_s"] > 0.0


class _Noisy(nn.Module):
    """Dropout and batch norm: a forward draws random numbers and moves running statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.norm, self.drop = nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Dropout(0.5)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.linear(inputs)))


def test_warm_up_puts_back_gradients_buffers_and_the_random_generator() -> None:
    torch.manual_seed(0)
    model = _Noisy()
    batch = Batch(inputs=torch.randn(8, 4), targets=torch.randn(8, 3), num_samples=8, num_elements=8)
    buffers = [b.clone() for b in model.buffers()]
    rng = torch.random.get_rng_state()
    seconds = warm_up(
        model, batch, PlainPrecision("fp32", torch.device("cpu")), lambda m, b: ((m(b.inputs) - b.targets) ** 2).sum()
    )
    assert seconds >= 0.0
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), buffers, strict=True))
    assert torch.equal(torch.random.get_rng_state(), rng)


@pytest.mark.parametrize("fields", [{"parallelism": "fsdp"}, {"precision": "fp8", "gpus": 1}])
def test_combinations_that_do_not_compile_are_rejected_naming_compile(
    tiny_mlp_spec: Callable[..., JobSpec], fields: dict[str, object]
) -> None:
    tiny_mlp_spec(**fields)  # valid without compile
    with pytest.raises(ValidationError) as caught:
        tiny_mlp_spec(compile=True, **fields)
    assert [e["loc"] for e in caught.value.errors()] == [("compile",)]
