"""Step records gathered on the device, copied to the host once per logging interval.

Each attempted optimizer step writes one row of a preallocated ``[capacity, F]``
float64 buffer on the training device with a single ``torch.stack(..., out=row)``:
the window loss, the loss scale used, the overflow kind, the cumulative skipped steps,
the raw gradient norm, the learning rate used and the global sample and token counts
(:data:`FIELDS`). Nothing is read on the host while rows accumulate. :meth:`StepLog.drain`
copies the filled rows with one ``tolist()`` (the interval's only device-to-host
synchronisation) and returns them as :class:`StepRow` host values. float64 holds
every field exactly: float32 values, and integer counts up to 2**53.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

#: Columns of the device buffer, in order.
FIELDS = ("loss", "loss_scale", "overflow_kind", "skipped_steps", "grad_norm", "lr", "samples", "tokens")


@dataclass(frozen=True)
class StepRow:
    """One attempted step, read back on the host.

    ``time``: unix seconds when the host issued the step; ``loss``: global mean loss of
    the window (may be non-finite); ``overflow_kind``: 0 clean, 1 infinities, 2 NaN;
    ``grad_norm``: pre-clip norm of the unscaled gradients (non-finite on overflow);
    ``samples``/``tokens``: global counts of the window (``tokens`` None for non-token data).
    """

    step: int
    time: float
    loss: float
    loss_scale: float
    overflow_kind: float
    skipped_steps: int
    grad_norm: float
    lr: float
    samples: int
    tokens: int | None

    @property
    def overflow(self) -> bool:
        """Non-finite gradients were found and the update skipped."""
        return self.overflow_kind > 0.0

    @property
    def nan(self) -> bool:
        """Some gradient held a NaN (not only infinities)."""
        return self.overflow_kind >= 2.0


class StepLog:
    """Up to ``capacity`` pending step rows in a device buffer.

    Args:
        capacity: rows per logging interval (>= 1).
        device: where the rows are written (the training device).

    Raises:
        ValueError: ``capacity`` < 1.
    """

    def __init__(self, capacity: int, device: torch.device) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._buffer = torch.zeros((capacity, len(FIELDS)), dtype=torch.float64, device=device)
        self._steps: list[int] = []
        self._times: list[float] = []
        self._has_tokens: list[bool] = []

    @property
    def pending(self) -> int:
        """Rows written since the last :meth:`drain`."""
        return len(self._steps)

    @property
    def full(self) -> bool:
        """True when the next :meth:`record` would not fit."""
        return self.pending >= self.capacity

    def record(self, step: int, values: Sequence[Tensor], has_tokens: bool) -> None:
        """Write step ``step``'s 0-d ``values`` (one per :data:`FIELDS` entry, any dtypes) into the next row.

        Raises:
            RuntimeError: the buffer is full (drain it first).
            ValueError: the wrong number of values.
        """
        if self.full:
            raise RuntimeError("step log is full: drain() before recording more steps")
        if len(values) != len(FIELDS):
            raise ValueError(f"expected {len(FIELDS)} values {FIELDS}, got {len(values)}")
        torch.stack(list(values), out=self._buffer[self.pending])
        self._steps.append(step)
        self._times.append(time.time())
        self._has_tokens.append(has_tokens)

    def drain(self) -> list[StepRow]:
        """The pending rows on the host (one device-to-host copy), oldest first; empties the log."""
        if not self._steps:
            return []
        values = self._buffer[: self.pending].tolist()
        rows = [
            StepRow(
                step=step,
                time=when,
                loss=row[0],
                loss_scale=row[1],
                overflow_kind=row[2],
                skipped_steps=int(row[3]),
                grad_norm=row[4],
                lr=row[5],
                samples=int(row[6]),
                tokens=int(row[7]) if has_tokens else None,
            )
            for step, when, has_tokens, row in zip(self._steps, self._times, self._has_tokens, values)
        ]
        self._steps, self._times, self._has_tokens = [], [], []
        return rows
