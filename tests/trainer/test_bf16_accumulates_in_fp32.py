"""Field case C15 (deepspeedai/DeepSpeed#2768): bf16 runs accumulate gradients in fp32."""

from __future__ import annotations

import torch
from torch import nn
from trainer_support import grad_of

from halfcast.contracts.spec import JobSpec
from trainer.numerics.precision import build_precision

CPU = torch.device("cpu")
K = 64


def _accumulate(precision: str) -> nn.Linear:
    """Micro-batch 0 gives the weight a gradient of 1.0; each of the next K adds 1e-3."""
    spec = JobSpec.model_validate({"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "precision": precision})
    policy = build_precision(spec, CPU)
    layer = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(0.5)
    inputs = [torch.ones(1, 1)] + [torch.full((1, 1), 1e-3)] * K
    for x in inputs:
        with policy.autocast():
            out = layer(x)
        policy.backward(out.float().sum())
    optimizer = torch.optim.SGD(layer.parameters(), lr=1.0)
    outcome = policy.step(optimizer, list(layer.parameters()), None)
    assert outcome.applied
    return layer


def test_bf16_accumulated_gradient_keeps_small_contributions() -> None:
    """C15."""
    layer = _accumulate("bf16")
    grad = grad_of(layer.weight)
    assert grad.dtype == torch.float32
    assert abs(grad.item() - 1.064) < 1e-4  # a bf16 buffer would stay at 1.0
    reference = _accumulate("fp32")
    torch.testing.assert_close(layer.weight, reference.weight, rtol=0, atol=1e-4)
