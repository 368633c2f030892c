"""From device step rows to step records: one flush per logging interval.

:class:`RecordFlusher` drains the loop's :class:`trainer.telemetry.StepLog` (one
device-to-host copy), writes one step record per attempted step (rank 0), logs
progress, then lets the divergence guard check the rows (every rank, so all ranks stop
at the same flush).
"""

from __future__ import annotations

import logging
import time

from trainer.guard import DivergenceGuard
from trainer.records import RecordSink, StepRecord
from trainer.telemetry import StepLog, StepRow

log = logging.getLogger(__name__)


class RecordFlusher:
    """Copies pending step rows to the host, writes their records, checks the guard, logs progress.

    Throughput is honest without per-step syncs: the samples (tokens) of the rows of
    one flush divided by the wall time since the previous flush (or the last
    evaluation or checkpoint), measured after the copy, which waits for the device.

    Args:
        step_log: the loop's device step log.
        records: the records sink (writes nothing on ranks other than 0).
        guard: the divergence guard, given every flushed row (may raise ``TrainerError``).
        max_steps: the job's attempted steps (for progress logging).
        main: this is rank 0 (logs progress).
    """

    def __init__(self, step_log: StepLog, records: RecordSink, guard: DivergenceGuard, max_steps: int,
                 main: bool) -> None:
        self.step_log = step_log
        self.records = records
        self.guard = guard
        self.max_steps = max_steps
        self.main = main
        self.skipped_steps: int | None = None
        self._since = time.perf_counter()

    def restart_clock(self) -> None:
        """Start a new throughput interval (after time spent outside training steps)."""
        self._since = time.perf_counter()

    def flush(self) -> None:
        """Drain the step log (one device-to-host copy), write records, then check the guard (may raise)."""
        rows = self.step_log.drain()
        if not rows:
            return
        seconds = max(time.perf_counter() - self._since, 1e-9)
        self._write(rows, seconds)
        self.restart_clock()
        self.guard.observe(rows)

    def flush_after_failure(self) -> None:
        """Best effort on the way out of a failure: write the pending records, never raise."""
        try:
            rows = self.step_log.drain()
            if rows:
                self._write(rows, max(time.perf_counter() - self._since, 1e-9))
        except Exception:  # noqa: BLE001 - the original failure is what matters
            log.exception("could not write the step records pending at the failure")

    def _write(self, rows: list[StepRow], seconds: float) -> None:
        samples_per_second = sum(r.samples for r in rows) / seconds
        token_rows = [r.tokens for r in rows if r.tokens is not None]
        tokens_per_second = sum(token_rows) / seconds if len(token_rows) == len(rows) else None
        self.records.steps((r.time, _step_record(r, samples_per_second, tokens_per_second)) for r in rows)
        self.skipped_steps = rows[-1].skipped_steps
        if self.main:
            for row in rows:
                _log_progress(row, self.max_steps)


def _step_record(row: StepRow, samples_per_second: float, tokens_per_second: float | None) -> StepRecord:
    return StepRecord(
        step=row.step,
        loss=row.loss,
        loss_scale=row.loss_scale,
        overflow=row.overflow,
        skipped_steps=row.skipped_steps,
        grad_norm=None if row.overflow else row.grad_norm,
        lr=row.lr,
        samples_per_second=samples_per_second,
        tokens_per_second=tokens_per_second,
    )


def _log_progress(row: StepRow, max_steps: int) -> None:
    step = row.step
    if step == 1 or step == max_steps or step % max(1, max_steps // 10) == 0 or row.overflow:
        log.info(
            "step %d/%d loss %.4g scale %g overflow %s skipped %d grad_norm %s lr %.3g",
            step, max_steps, row.loss, row.loss_scale, row.overflow,
            row.skipped_steps, None if row.overflow else row.grad_norm, row.lr,
        )
