"""Training throughput that is true: trailing windows of at least :data:`MIN_WINDOW_S` of training time.

A step record's ``samples_per_second`` (``tokens_per_second``) is measured at the flush that
writes it, after the device-to-host copy (which waits for the device), over the trailing
window of training time that ends there and reaches back to the latest earlier flush at
least :data:`MIN_WINDOW_S` before it (or, earlier in the run, to the end of the first step):
the samples (tokens) of every step attempted in that window over its length. Training time
is wall time minus what :meth:`ThroughputMeter.pause` leaves out (evaluations and
checkpoints); the records' own writing counts (it is part of what a step costs). So a rate
never comes from a near-zero interval that holds steps the clock did not see, and a burst of
two quick steps after a pause reads the same rate as the steps around it.

The first flushed steps (the first step of the process: start-up, compilation, first
allocations) get the rate of their own interval since the flusher was made; the windows
start after them.

:meth:`ThroughputMeter.whole_run` is the run's headline figure: the samples (tokens) of the
steps that applied an update, over the training time since the end of the first step (this
process: a resumed attempt counts from its resume). The ``end`` record carries it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainer.run.telemetry import StepRow

#: The shortest trailing window a step record's rate is measured over, in seconds of training time.
MIN_WINDOW_S = 1.0


@dataclass(frozen=True)
class Rates:
    """Samples and tokens per second (``tokens_per_second`` None for data without tokens)."""

    samples_per_second: float
    tokens_per_second: float | None


@dataclass(frozen=True)
class _Mark:
    """The cumulative counts at one flush, at a point of training time."""

    at: float
    samples: int
    tokens: int | None


class ThroughputMeter:
    """Trailing-window and whole-run throughput over training time (see the module docstring).

    ``clock`` is monotonic seconds (a test passes a fake one).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter, min_window_s: float = MIN_WINDOW_S) -> None:
        self._clock = clock
        self._min_window_s = min_window_s
        self._made = clock()
        self._training_s = 0.0  # training time before the current running stretch
        self._running_since: float | None = None
        self._marks: deque[_Mark] = deque()
        self._applied = _Mark(0.0, 0, 0)

    @property
    def started(self) -> bool:
        """The first flushed steps were seen: windows are measured from their end."""
        return bool(self._marks)

    def training_time(self) -> float:
        """Seconds of training time since the end of the first flushed steps."""
        running = self._clock() - self._running_since if self._running_since is not None else 0.0
        return self._training_s + running

    def pause(self) -> None:
        """Stop counting training time (an evaluation or a checkpoint begins)."""
        if self._running_since is not None:
            self._training_s += self._clock() - self._running_since
            self._running_since = None

    def resume(self) -> None:
        """Count training time again."""
        if self._running_since is None and self.started:
            self._running_since = self._clock()

    def observe(self, rows: Sequence[StepRow]) -> Rates | None:
        """The rate to write on ``rows`` (just copied from the device); ``None`` for an empty flush."""
        if not rows:
            return None
        if not self.started:
            return self._start(rows)
        now = self.training_time()
        last = self._marks[-1]
        mark = _Mark(now, last.samples + _samples(rows), _add(last.tokens, _tokens(rows)))
        self._count_applied(rows, now)
        self._marks.append(mark)
        while len(self._marks) > 2 and now - self._marks[1].at >= self._min_window_s:
            self._marks.popleft()  # keep the latest mark at least a window back, and nothing older
        return _rate(self._marks[0], mark)

    def whole_run(self) -> Rates | None:
        """Applied steps' samples (tokens) per second of training time, from the end of the first flushed steps
        to the last flush; ``None`` when no step was flushed after the first ones."""
        if len(self._marks) < 2:
            return None
        return _rate(_Mark(0.0, 0, 0), self._applied)

    def _start(self, rows: Sequence[StepRow]) -> Rates | None:
        seconds = self._clock() - self._made
        self._marks.append(_Mark(0.0, 0, 0))
        self._running_since = self._clock()
        return _rate(_Mark(0.0, 0, 0), _Mark(seconds, _samples(rows), _tokens(rows)))

    def _count_applied(self, rows: Sequence[StepRow], now: float) -> None:
        applied = [row for row in rows if not row.overflow and row.tokens != 0]
        tokens = None if _tokens(rows) is None else _add(self._applied.tokens, _tokens(applied))
        self._applied = _Mark(now, self._applied.samples + _samples(applied), tokens)


def _samples(rows: Sequence[StepRow]) -> int:
    return sum(row.samples for row in rows)


def _tokens(rows: Sequence[StepRow]) -> int | None:
    """The rows' tokens; None when one row has none (data without tokens)."""
    counts = [row.tokens for row in rows]
    return None if any(count is None for count in counts) else sum(count or 0 for count in counts)


def _add(total: int | None, more: int | None) -> int | None:
    return None if total is None or more is None else total + more


def _rate(since: _Mark, until: _Mark) -> Rates | None:
    seconds = until.at - since.at
    if seconds <= 0:
        return None
    tokens = _add(until.tokens, None if since.tokens is None else -since.tokens)
    return Rates((until.samples - since.samples) / seconds, None if tokens is None else tokens / seconds)
