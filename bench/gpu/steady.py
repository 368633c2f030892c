"""Warm up, then run and time the steady steps of one path, each inside its sync guard."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from bench.gpu.syncs import SyncGuard, synchronize

#: One step ``n`` (1-based), the part that runs inside the guard.
StepFn = Callable[[int], None]
#: What follows step ``n`` outside the guard (Halfcast's telemetry flush), may be a no-op.
AfterFn = Callable[[int], None]


def _no_after(step: int) -> None:
    """Nothing after a step."""


def timed_steady_steps(
    step: StepFn, warmup: int, steps: int, guard: SyncGuard, device: torch.device, after: AfterFn = _no_after
) -> float:
    """Steps ``1..warmup`` unguarded, then ``steps`` guarded ones; wall seconds of the latter (device synced)."""
    for n in range(1, warmup + 1):
        step(n)
        after(n)
    synchronize(device)
    start = time.perf_counter()
    for n in range(warmup + 1, warmup + steps + 1):
        with guard.around_step():
            step(n)
        after(n)
    synchronize(device)
    return time.perf_counter() - start
