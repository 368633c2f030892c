"""Step records gathered on the device, copied to the host once per logging interval.

Each attempted optimizer step writes one row of a preallocated ``[capacity, F + W + P]``
float64 buffer on the training device (one ``torch._foreach_copy_`` into views of the row's
cells taken once): the window loss, the loss scale used, the overflow
flag, the cumulative skipped steps, the raw gradient norm, the learning rate used, the
sampled underflow fraction, the global sample and token counts (:class:`StepMetrics`; counts a
single process knows on the host stay there, beside the row), then the step's
overflow evidence (:mod:`trainer.numerics.forensics`: the kind per rank, then per parameter; from one
process, the per-parameter gradient norms alone, whose NaN or infinity is the kind).
Nothing is read on the host while rows accumulate. :meth:`StepLog.drain` copies the
filled rows with one ``tolist()`` (the interval's only device-to-host
synchronisation) and returns them as :class:`StepRow` host values, telling the kinds
(0 finite, 1 infinite, 2 NaN) from the flag and the norms there, where it costs the step nothing. float64 holds
every field exactly: float32 values, and integer counts up to 2**53.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from trainer.numerics.overflow import kind_of_norm, kind_of_step


class StepMetrics(NamedTuple):
    """One step's values for its row, as 0-d device tensors (any dtypes): the buffer's columns, in order.

    ``loss``: the window's global mean loss, or its total when the log divides it (``loss_count`` of
    :meth:`StepLog.record`); ``loss_scale``: the scale used; ``overflow``:
    the step's overflow flag (0 or 1); ``skipped_steps``: cumulative; ``grad_norm``: pre-clip norm
    of the unscaled gradients; ``lr``: the learning rate used; ``samples``, ``tokens``: the
    window's global counts (``tokens`` = ``samples`` for non-token data); ``underflow_fraction``:
    NaN when the step was not sampled. The counts may be python ints (one process knows them from
    the batches' metadata): they then stay on the host and the row's write covers the other columns.
    """

    loss: Tensor
    loss_scale: Tensor
    overflow: Tensor
    skipped_steps: Tensor
    grad_norm: Tensor
    lr: Tensor
    underflow_fraction: Tensor
    samples: Tensor | int
    tokens: Tensor | int

    def device_columns(self) -> list[Tensor]:
        """The first :data:`DEVICE_FIELDS` values, in order: those only the device knows."""
        return [
            self.loss,
            self.loss_scale,
            self.overflow,
            self.skipped_steps,
            self.grad_norm,
            self.lr,
            self.underflow_fraction,
        ]


#: Columns of the device buffer, in order.
FIELDS: tuple[str, ...] = StepMetrics._fields

#: The leading columns that only the device knows; the counts after them may be host integers.
DEVICE_FIELDS = len(FIELDS) - 2


class StepRow(NamedTuple):
    """One attempted step, read back on the host (a named tuple: a flush builds one per step).

    ``time``: unix seconds when the host issued the step; ``loss``: global mean loss of
    the window (may be non-finite); ``overflow_kind``: 0 clean, 1 infinities, 2 NaN;
    ``grad_norm``: pre-clip norm of the unscaled gradients (non-finite on overflow);
    ``samples``/``tokens``: global counts of the window (``tokens`` None for non-token data);
    ``underflow_fraction``: NaN when the step was not sampled; ``rank_kinds`` and
    ``param_kinds``: the overflow evidence per rank and per parameter (0 finite, 1 inf,
    2 NaN; empty when the log keeps none).
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
    underflow_fraction: float = float("nan")
    rank_kinds: tuple[float, ...] = ()
    param_kinds: tuple[float, ...] = ()

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
        num_ranks, num_params: widths of the overflow evidence kept per row (0: none). With
            ``num_ranks`` 1 (one process) the row keeps no rank column (the one rank's kind is
            the step's) and its parameter columns hold the gradient norms
            (:attr:`trainer.numerics.step_outcome.StepOutcome.param_evidence`); with more ranks, the
            agreed kinds per rank and per parameter.

    Raises:
        ValueError: ``capacity`` < 1.
    """

    def __init__(self, capacity: int, device: torch.device, num_ranks: int = 0, num_params: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.num_ranks, self.num_params = num_ranks, num_params
        self.one_process = num_ranks == 1
        #: Widths of the evidence each :meth:`record` gets, in order.
        self.evidence_widths = (
            [num_params] if self.one_process else [num_ranks, num_params] if num_ranks + num_params else []
        )
        width = len(FIELDS) + sum(self.evidence_widths)
        self._buffer = torch.zeros((capacity, width), dtype=torch.float64, device=device)
        # Views of every row's cells (one 0-d view per column, then each evidence part), taken once: a
        # step's row is then written by one ``_foreach_copy_``. Per row, the targets of a step whose
        # counts stay on the host, and of one that wrote them too.
        bounds = [len(FIELDS)]
        for part in self.evidence_widths:
            bounds.append(bounds[-1] + part)
        cells = [list(row[: len(FIELDS)].unbind(0)) for row in self._buffer]
        evidence = [[row[a:b] for a, b in itertools.pairwise(bounds)] for row in self._buffer]
        self._host_count_targets = [c[:DEVICE_FIELDS] + e for c, e in zip(cells, evidence, strict=True)]
        self._all_targets = [c + e for c, e in zip(cells, evidence, strict=True)]
        self._steps: list[int] = []
        self._times: list[float] = []
        self._has_tokens: list[bool] = []
        self._host_counts: list[tuple[int, int] | None] = []
        self._loss_counts: list[int] = []

    @property
    def pending(self) -> int:
        """Rows written since the last :meth:`drain`."""
        return len(self._steps)

    @property
    def oldest_time(self) -> float | None:
        """Unix time of the oldest pending row, or ``None`` when none is pending."""
        return self._times[0] if self._times else None

    @property
    def full(self) -> bool:
        """True when the next :meth:`record` would not fit."""
        return len(self._steps) >= self.capacity

    def record(
        self, step: int, values: StepMetrics, has_tokens: bool, evidence: Sequence[Tensor] = (), loss_count: int = 1
    ) -> None:
        """Write step ``step``'s 0-d ``values`` into the next row.

        ``loss_count``: the host divides the row's loss by it when it reads the row (in float64, as the
        device would: one process's window mean costs the step no op).

        ``evidence``: tensors of :attr:`evidence_widths` (see the class): ``(param_norms,)`` from one
        process, ``(rank_kinds, param_kinds)`` from several (:class:`trainer.numerics.step_outcome.StepOutcome`).

        Raises:
            RuntimeError: the buffer is full (drain it first).
            ValueError: the wrong number of values, or evidence of the wrong width.
        """
        index = len(self._steps)
        if index >= self.capacity:
            raise RuntimeError("step log is full: drain() before recording more steps")
        if len(values) != len(FIELDS):
            raise ValueError(f"expected {len(FIELDS)} values {FIELDS}, got {len(values)}")
        samples, tokens = values.samples, values.tokens
        on_host = type(samples) is int and type(tokens) is int
        sources = values.device_columns()
        if not on_host:
            device = self._buffer.device
            sources += [v if isinstance(v, Tensor) else torch.tensor(v, device=device) for v in (samples, tokens)]
        if self.evidence_widths:
            widths = [t.numel() for t in evidence]
            if widths != self.evidence_widths:
                raise ValueError(f"expected evidence widths {self.evidence_widths}, got {widths}")
            sources += evidence
        targets = self._host_count_targets[index] if on_host else self._all_targets[index]
        torch._foreach_copy_(targets, sources)  # the whole row, every value cast to float64, in one op
        self._host_counts.append((samples, tokens) if on_host else None)  # type: ignore[arg-type]  # ints: on_host
        self._loss_counts.append(loss_count)
        self._steps.append(step)
        self._times.append(time.time())
        self._has_tokens.append(has_tokens)

    def drain(self) -> list[StepRow]:
        """The pending rows on the host (one device-to-host copy), oldest first; empties the log."""
        if not self._steps:
            return []
        values = self._buffer[: len(self._steps)].tolist()
        rows = [
            self._row(step, when, has_tokens, counts, loss_count, row)
            for step, when, has_tokens, counts, loss_count, row in zip(
                self._steps, self._times, self._has_tokens, self._host_counts, self._loss_counts, values, strict=True
            )
        ]
        self._steps, self._times, self._has_tokens, self._host_counts, self._loss_counts = [], [], [], [], []
        return rows

    def _row(
        self,
        step: int,
        when: float,
        has_tokens: bool,
        counts: tuple[int, int] | None,
        loss_count: int,
        values: list[float],
    ) -> StepRow:
        """One buffer row read back: the :class:`StepMetrics` columns in order (the loss divided by its
        count, the counts from the host when they stayed there), the step's kind told from its flag and
        norm, then the evidence."""
        loss, loss_scale, flag, skipped, grad_norm, lr, underflow, samples, tokens = values[: len(FIELDS)]
        if loss_count != 1:
            loss /= loss_count
        if counts is not None:
            samples, tokens = counts
        kind = kind_of_step(flag, grad_norm)
        return StepRow(
            step,
            when,
            loss,
            loss_scale,
            kind,
            int(skipped),
            grad_norm,
            lr,
            int(samples),
            int(tokens) if has_tokens else None,
            underflow,
            *self._evidence(kind, values),
        )

    def _evidence(self, kind: float, values: list[float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """``(rank_kinds, param_kinds)`` of a row: one process's from its kind and gradient norms."""
        if self.one_process:
            return (kind,), tuple(map(kind_of_norm, values[len(FIELDS) :]))
        if not self.evidence_widths:
            return (), ()
        ranks_end = len(FIELDS) + self.num_ranks
        return tuple(values[len(FIELDS) : ranks_end]), tuple(values[ranks_end:])
