"""From device step rows to step records: one flush per logging interval.

:class:`RecordFlusher` drains the loop's :class:`trainer.run.telemetry.StepLog` (one
device-to-host copy), writes one step record per attempted step (rank 0), logs
progress, and hands the rows back: the loop then lets the divergence guard check them
(every rank, so all ranks stop at the same flush). :class:`RunTotals` counts the samples
and tokens of every attempted step, across resumes.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from trainer.numerics.forensics import describe_overflow
from trainer.records import RecordSink, StepRecord
from trainer.run.telemetry import StepLog, StepRow
from trainer.throughput import Rates, ThroughputMeter

log = logging.getLogger(__name__)


@dataclass
class RunTotals:
    """Samples and tokens of every attempted step of the job so far (a checkpoint's, then counted on).

    Mutable on purpose: the record flusher adds each written row, checkpoints read it.
    """

    samples: int = 0
    tokens: int = 0

    @classmethod
    def from_counters(cls, counters: Mapping[str, int]) -> RunTotals:
        """The totals a checkpoint's ``counters`` hold (``samples_total``, ``tokens_total``; 0 when missing)."""
        return cls(int(counters.get("samples_total", 0)), int(counters.get("tokens_total", 0)))

    def add(self, row: StepRow) -> None:
        """Count one attempted step's row."""
        self.samples += row.samples
        self.tokens += row.tokens or 0

    def as_counters(self) -> dict[str, int]:
        """``samples_total`` and ``tokens_total``, for a checkpoint's ``counters``."""
        return {"samples_total": self.samples, "tokens_total": self.tokens}


class RecordFlusher:
    """Copies pending step rows to the host, writes their records, logs progress; returns the rows to check.

    Throughput is honest without per-step syncs: measured at each flush, after the copy
    (which waits for the device), over a trailing window of training time of at least
    :data:`trainer.throughput.MIN_WINDOW_S` (:class:`trainer.throughput.ThroughputMeter`);
    :meth:`pause` and :meth:`resume` leave evaluations and checkpoints out.

    Args:
        step_log: the loop's device step log.
        records: the records sink (writes nothing on ranks other than 0).
        max_steps: the job's attempted steps (for progress logging).
        main: this is rank 0 (logs progress).
        param_names: module paths of the trainable parameters, in model order (names the
            overflow evidence of the step log's rows; empty when it keeps none).
        max_latency_s: on rank 0, :meth:`flush_if_stale` writes pending records once the
            oldest is this old (``None``: only :meth:`flush` writes).
        totals: the job's totals before this flusher's first row (a resumed run's, from its
            checkpoint); counted on as rows are written.
    """

    def __init__(
        self,
        step_log: StepLog,
        records: RecordSink,
        max_steps: int,
        main: bool,
        param_names: Sequence[str] = (),
        max_latency_s: float | None = None,
        totals: RunTotals | None = None,
        meter: ThroughputMeter | None = None,
    ) -> None:
        self.step_log = step_log
        self.param_names = list(param_names)
        self.max_latency_s = max_latency_s if main else None
        self.totals = totals if totals is not None else RunTotals()
        self._unchecked: list[StepRow] = []
        self.records = records
        self.max_steps = max_steps
        self.main = main
        self.skipped_steps: int | None = None
        self.meter = meter if meter is not None else ThroughputMeter()

    def pause(self) -> None:
        """Time from here to :meth:`resume` is not training time (an evaluation, a checkpoint)."""
        self.meter.pause()

    def resume(self) -> None:
        """Training time counts again."""
        self.meter.resume()

    def flush(self) -> list[StepRow]:
        """Drain the step log (one device-to-host copy) and write its records; return the rows to check.

        The rows returned are every row written since the last call, those
        :meth:`flush_if_stale` wrote included. Every rank calls this at the same steps and
        hands the rows to its divergence guard, so the guard stops all ranks together.
        """
        rows = self.step_log.drain()
        if rows:
            self._write(rows)
        checked, self._unchecked = self._unchecked + rows, []
        return checked

    def flush_if_stale(self) -> None:
        """Rank 0: write the pending records if the oldest waited ``max_latency_s`` (one device-to-host copy).

        Bounds the telemetry latency when steps are slow; :meth:`flush` returns these rows
        for the check (the ranks must decide together, and only rank 0 flushes here).
        """
        oldest = self.step_log.oldest_time
        if self.max_latency_s is None or oldest is None or time.time() - oldest < self.max_latency_s:
            return
        rows = self.step_log.drain()
        self._write(rows)
        self._unchecked.extend(rows)

    def flush_after_failure(self) -> None:
        """Best effort on the way out of a failure: write the pending records, never raise."""
        try:
            rows = self.step_log.drain()
            if rows:
                self._write(rows)
        except Exception:
            log.exception("could not write the step records pending at the failure")

    def _write(self, rows: list[StepRow]) -> None:
        rates = self.meter.observe(rows)
        step_fields = self.records.step_fields
        totals = self.totals
        records = []
        for row in rows:
            totals.add(row)
            extra: _StepExtra = {
                "samples_total": totals.samples,
                "tokens_total": totals.tokens if row.tokens is not None else None,
                **step_fields,
                "time": row.time,
            }
            records.append((row.time, _step_record(row, rates, self.param_names, extra)))
        self.records.steps(records)
        self.skipped_steps = rows[-1].skipped_steps
        if self.main:
            for row in rows:
                _log_progress(row, self.max_steps)


class _StepExtra(TypedDict):
    """A step record's fields from outside its row: the run's totals, the sink's step fields, its time."""

    samples_total: int
    tokens_total: int | None
    precision: NotRequired[str]
    time: float


def _step_record(
    row: StepRow,
    rates: Rates | None,
    param_names: Sequence[str],
    extra: _StepExtra,
) -> StepRecord:
    """The step record of ``row``, validated once with ``extra`` (totals, the sink's step fields, its time)."""
    report = (
        describe_overflow(param_names, row.rank_kinds, row.param_kinds) if row.overflow and row.rank_kinds else None
    )
    return StepRecord(
        **extra,
        step=row.step,
        loss=row.loss,
        loss_scale=row.loss_scale,
        overflow=row.overflow,
        skipped_steps=row.skipped_steps,
        grad_norm=None if row.overflow else row.grad_norm,
        lr=row.lr,
        samples_per_second=rates.samples_per_second if rates else None,
        tokens_per_second=rates.tokens_per_second if rates else None,
        underflow_fraction=row.underflow_fraction if math.isfinite(row.underflow_fraction) else None,
        overflow_ranks=report.ranks if report else None,
        nonfinite_params=report.parameters if report else None,
        nonfinite_param_count=report.count if report else None,
    )


def _log_progress(row: StepRow, max_steps: int) -> None:
    step = row.step
    if step == 1 or step == max_steps or step % max(1, max_steps // 10) == 0 or row.overflow:
        log.info(
            "step %d/%d loss %.4g scale %g overflow %s skipped %d grad_norm %s lr %.3g",
            step,
            max_steps,
            row.loss,
            row.loss_scale,
            row.overflow,
            row.skipped_steps,
            None if row.overflow else row.grad_norm,
            row.lr,
        )
