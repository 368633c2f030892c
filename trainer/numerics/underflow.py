"""Underflow telemetry: how much of the fp16 backward pass lands on zero or a subnormal.

A loss scale that is too low shows up as gradient values too small for fp16: they
become subnormal (below the smallest normal, 2**-14 ≈ 6.1e-5, with fewer significant
bits) or flush to zero, and their information is lost before unscaling. The fraction
is measured on the accumulated parameter gradients *before* unscaling, i.e. on the
values the fp16 backward produced (autocast casts each fp16 weight gradient to the
fp32 master gradient exactly). Structurally zero gradients (dead units, unused
embedding rows) count as well, so read the fraction as a trend: it rising while the
scale falls means the scale is too low (Micikevicius et al., "Mixed Precision
Training", ICLR 2018, §3.2 on gradient values lost to underflow).

:class:`UnderflowSampler` is a step observer (:mod:`trainer.numerics.observers`) that the fp16
policy is built with: it samples every ``loss_scale.underflow_sample_interval`` steps,
which keeps the cost off the other steps; a sampled step does one comparison pass over
the gradients and no host synchronisation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from trainer.parallel.sharded import is_sharded, local_tensor

#: Smallest positive normal float16 (2**-14): values below it are subnormal or zero in fp16.
FP16_MIN_NORMAL = torch.finfo(torch.float16).tiny


class UnderflowSampler:
    """Step observer: on every ``interval``-th attempted step, the :func:`underflow_fraction` of the scaled gradients.

    Every rank samples at the same steps (the step number is the same on every rank), so
    the sharded count's collective is joined by all.
    """

    def __init__(self, interval: int, device: torch.device) -> None:
        if interval < 1:
            raise ValueError(f"underflow sample interval must be at least 1, got {interval}")
        self.interval = interval
        self.device = device

    def before_unscale(self, step: int | None, grads: Sequence[Tensor]) -> Tensor | None:
        """The fraction on a sampled step (0-d float32 on the device), ``None`` on the others and unnumbered steps."""
        if step is None or step % self.interval != 0:
            return None
        return underflow_fraction(grads, self.device)


def underflow_fraction(grads: Sequence[Tensor], device: torch.device) -> Tensor:
    """Fraction of gradient values with ``|g| < 2**-14`` (zero or subnormal in fp16).

    Args:
        grads: the (still scaled) gradients: plain tensors, or DTensors whose local
            shards are counted on this rank and summed over the mesh (one
            ``all_reduce``, a collective every rank must join at the same step);
            replicated gradients count once.
        device: where the result lives.

    Returns:
        0-d float32 tensor in ``[0, 1]`` on ``device``; NaN for no gradient values.
        Non-finite values count as not underflowing.
    """
    sharded = [g for g in grads if is_sharded(g)]
    replicated = [g for g in grads if not is_sharded(g)]
    small = _count_small(sharded, device)
    total: int | Tensor = sum(local_tensor(g).numel() for g in sharded)
    if sharded and dist.is_initialized():
        counts = torch.stack([small, torch.full((), float(total), dtype=torch.float64, device=device)])
        dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=sharded[0].device_mesh.get_group())
        small, total = counts[0], counts[1]
    small = small + _count_small(replicated, device)
    total = total + sum(g.numel() for g in replicated)
    return (
        (small / total).float()
        if not isinstance(total, int) or total > 0
        else torch.full((), float("nan"), device=device)
    )


def _count_small(grads: Sequence[Tensor], device: torch.device) -> Tensor:
    """float64 0-d count of local values with ``|g| < 2**-14`` over ``grads``."""
    count = torch.zeros((), dtype=torch.float64, device=device)
    for grad in grads:
        count += (local_tensor(grad).abs() < FP16_MIN_NORMAL).sum().to(device=device, dtype=torch.float64)
    return count
