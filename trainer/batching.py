"""Batch planning: micro-batch, gradient accumulation steps, global batch, and windows.

One optimizer step consumes a *window* of ``accumulation_steps`` micro-batches on
every rank, so ``global_batch_size = micro_batch_size * accumulation_steps * world_size``
(docs/job-spec.md, "Fields").
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from halfcast.contracts.spec import JobSpec

T = TypeVar("T")


@dataclass(frozen=True)
class BatchPlan:
    """Samples per micro-batch (per rank), micro-batches per optimizer step, and ranks."""

    micro_batch_size: int
    accumulation_steps: int
    world_size: int

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step over all ranks (full micro-batches)."""
        return self.micro_batch_size * self.accumulation_steps * self.world_size


def plan_batches(spec: JobSpec) -> BatchPlan:
    """The plan of ``spec``: accumulation given, or derived from ``global_batch_size``.

    The spec has already checked that ``micro_batch_size * world_size`` divides the global batch.
    """
    return BatchPlan(
        micro_batch_size=spec.micro_batch_size,
        accumulation_steps=spec.accumulation_steps,
        world_size=spec.world_size,
    )


def windows(micro_batches: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive windows of ``size`` items; the last window is shorter when the input runs out.

    Raises ``ValueError`` for ``size < 1``.
    """
    if size < 1:
        raise ValueError(f"window size must be at least 1, got {size}")
    iterator = iter(micro_batches)
    while window := list(itertools.islice(iterator, size)):
        yield window
