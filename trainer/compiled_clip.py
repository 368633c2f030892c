"""``compile: true`` on CUDA: the one-process precision step's check and clip as one compiled graph.

After the scaler's unscale, a one-process step takes each gradient's norm, the global norm, the
overflow flag (the global norm's non-finiteness) and clips: eight small device ops, no host
read. :func:`check_and_clip` is that sequence as one pure function, so ``torch.compile``
traces it whole (``fullgraph=True``: a graph break is an error, not a slow path) and Inductor
fuses the elementwise work into a few kernels; the scaler's fused unscale kernel and the fused
optimizer stay eager (each is one kernel already). Eager and compiled agree on every skip
decision; the norms, and so the clipped gradients, may differ in the last bits (Inductor's
reductions sum in another order).

Where: CUDA only. On a CPU each op is a function call, not a kernel launch, and a compiled
graph's guards and call cost more than the eight ops (measured: 42 µs compiled against 23 µs
eager on the tiny MLP's gradients, docs/benchmarks.md), so the CPU path stays eager. Sharded
(DTensor) or non-float32 gradients take the eager path too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from trainer.numerics.overflow import nonfinite_flag
from trainer.parallel.sharded import CLIP_EPS


class CheckedNorms(NamedTuple):
    """What :func:`check_and_clip` found: float32 per-tensor norms, the global norm and the overflow flag."""

    per_tensor: Tensor
    total: Tensor
    flag: Tensor


def check_and_clip(grads: list[Tensor], max_grad_norm: float | None) -> CheckedNorms:
    """Per-tensor and global L2 norms of ``grads`` (float32, one device), the overflow flag, and ``grads``
    scaled in place by ``min(1, max_grad_norm / (norm + 1e-6))`` when ``max_grad_norm`` is given (the same
    ops, in the same order, as the eager step: :func:`trainer.parallel.sharded.grad_norms`, :func:`nonfinite_flag`,
    :func:`trainer.parallel.sharded.clip_grads_`)."""
    per_tensor = torch.stack(torch._foreach_norm(grads, 2.0))
    total = torch.linalg.vector_norm(per_tensor, 2.0)
    flag = nonfinite_flag(total)
    if max_grad_norm is not None:
        coefficient = (max_grad_norm / (total + CLIP_EPS)).clamp(max=1.0)
        torch._foreach_mul_(grads, coefficient)
    return CheckedNorms(per_tensor, total, flag)


CheckFn = Callable[[list[Tensor], float | None], CheckedNorms]


def compile_check(backend: str = "inductor") -> CheckFn:
    """:func:`check_and_clip` through ``torch.compile`` (whole graph, static shapes; compiled at its first call)."""
    compiled: CheckFn = torch.compile(check_and_clip, fullgraph=True, dynamic=False, backend=backend)
    return compiled


def compilable(grads: Sequence[Tensor]) -> bool:
    """Whether the compiled check takes these gradients: some, all plain float32 tensors on one device."""
    if not grads:
        return False
    device = grads[0].device
    return all(type(g) is not DTensor and g.dtype == torch.float32 and g.device == device for g in grads)
