"""Field case C03 (pytorch/pytorch#98828): the loss scale must not grow without bound."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn
from trainer_support import grad_of

from halfcast.contracts.spec import JobSpec
from trainer.numerics.precision import build_precision

CPU = torch.device("cpu")


def _fp32_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    reference = copy.deepcopy(model)
    nn.functional.mse_loss(reference(x), y).backward()
    return [grad_of(p) for p in reference.parameters()]


def test_tiny_loss_growth_interval_one_stays_bounded_and_matches_fp32() -> None:
    """C03."""
    torch.manual_seed(0)
    model = nn.Linear(5, 1)
    with torch.no_grad():  # predictions and targets near 1e-4: a tiny loss (~1e-10)
        for param in model.parameters():
            param.mul_(1e-4)
    spec = JobSpec.model_validate(
        {
            "model": {"name": "mlp"},
            "dataset": {"name": "synthetic"},
            "precision": "fp16",
            "loss_scale": {"init_scale": 65536.0, "growth_interval": 1},
        }
    )
    policy = build_precision(spec, CPU)
    assert spec.effective_loss_scale is not None
    max_scale = spec.effective_loss_scale.max_scale
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 5)
    y = 1e-4 * (1.0 + 0.1 * torch.randn(64, 1))
    scales = []
    for _ in range(300):
        expected = _fp32_grads(model, x, y)
        with policy.autocast():
            loss = nn.functional.mse_loss(model(x).float(), y)
        policy.backward(loss)
        outcome = policy.step(optimizer, list(model.parameters()), None)
        assert not outcome.overflow
        for param, ref in zip(model.parameters(), expected, strict=True):
            torch.testing.assert_close(param.grad, ref, rtol=2e-2, atol=1e-9)
        optimizer.zero_grad(set_to_none=True)
        scales.append(policy.loss_scale)
    assert all(math.isfinite(s) and s <= max_scale for s in scales)
    assert scales[-1] == max_scale
    assert policy.skipped_steps == 0
