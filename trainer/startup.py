"""The start-up phases of a run, from the worker's launch to its first step (issue 13).

A job's start-up is timed in five phases, each ending where the next begins:

- ``launch``: the worker starts torchrun → this rank's wrapper (``worker.launch.rank_output``)
  execs the trainer's Python (``worker.launch.deathsig``, torchrun's own start-up and
  rendezvous, the wrapper);
- ``imports``: → the training loop is entered (that Python's start-up, the torch and
  trainer imports, the spec, the process group);
- ``data``: → the dataset is built (the checkpoint a resumed run continues from read, the
  precision, tokenizer and dataset);
- ``model``: → the model is built and wrapped, with its optimizer and LR schedule (and the
  checkpoint restored into them);
- ``first_step``: → the first step's record is written (the run's first step is always
  flushed at once).

The worker passes its launch time in :data:`LAUNCHED_AT_ENV` and ``worker.launch.rank_output`` the
rank's start in :data:`RANK_STARTED_AT_ENV` (unix seconds); without them (a plain
``python -m trainer``) ``launch_s`` and ``imports_s`` are ``None``.

As ``data``, ``model`` and ``first_step`` begin, and once the first step is done
(``training``), rank 0 logs a line and writes a ``phase`` record ``{"type": "phase",
"time", "phase", "startup"}``: ``startup`` holds :class:`~halfcast.contracts.records.StartupTimes`, the seconds of the
phases ended so far (``None`` for the rest). The ``start`` record, written right after the
``first_step`` one, repeats them as its ``startup``.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping

from halfcast.contracts.records import PhaseName, StartupTimes
from trainer.records import RecordSink

log = logging.getLogger(__name__)

#: Unix time at which the worker started the run (set by ``worker.launch.process_tree.start_run``).
LAUNCHED_AT_ENV = "HALFCAST_LAUNCHED_AT"
#: Unix time at which this rank's trainer Python was started (set by ``worker.launch.rank_output`` just before its exec).
RANK_STARTED_AT_ENV = "HALFCAST_RANK_STARTED_AT"

#: The phase a ``phase`` record says begins; ``training``: start-up is over.
Phase = PhaseName

#: The field of :class:`~halfcast.contracts.records.StartupTimes` that the beginning of each phase ends.
_ENDED_BY: dict[Phase, str] = {"model": "data_s", "first_step": "model_s", "training": "first_step_s"}

#: What the log line of each phase says.
_LOG_TEXT: dict[Phase, str] = {
    "data": "loading data",
    "model": "building the model",
    "first_step": "running the first step",
    "training": "done, training",
}


def times_text(times: StartupTimes) -> str:
    """``launch 3.10 s, imports 4.23 s, data 0.31 s`` over the measured phases of ``times``."""
    known = [(name.removesuffix("_s"), value) for name, value in times.as_record().items() if value is not None]
    return ", ".join(f"{name.replace('_', ' ')} {value:.2f} s" for name, value in known)


def _stamp(environ: Mapping[str, str], name: str) -> float | None:
    """The unix time in ``environ[name]``; ``None`` when it is absent or not a finite number."""
    try:
        value = float(environ[name])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _seconds(start: float | None, end: float | None) -> float | None:
    """``end - start`` in seconds (rounded to the millisecond, never negative); ``None`` if either is unknown."""
    return None if start is None or end is None else round(max(0.0, end - start), 3)


def entry_times(environ: Mapping[str, str], entered_at: float) -> StartupTimes:
    """``launch_s`` and ``imports_s`` of a run whose training loop was entered at ``entered_at``."""
    launched, started = _stamp(environ, LAUNCHED_AT_ENV), _stamp(environ, RANK_STARTED_AT_ENV)
    return StartupTimes(launch_s=_seconds(launched, started), imports_s=_seconds(started, entered_at))


class StartupClock:
    """Times the start-up phases of one trainer process; rank 0 logs each and writes its ``phase`` record.

    Create it with :meth:`entered` when the training loop begins (the ``data`` phase
    begins), then call :meth:`begin` as each later phase begins. ``clock``: unix seconds.
    """

    def __init__(self, records: RecordSink, main: bool, clock: Callable[[], float] = time.time) -> None:
        self.records = records
        self.main = main
        self.clock = clock
        self.times = StartupTimes()
        self.phase: Phase | None = None
        self._since = clock()

    @classmethod
    def entered(
        cls,
        records: RecordSink,
        main: bool,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> StartupClock:
        """A clock for a training loop entered now: ``launch_s`` and ``imports_s`` from ``environ``, ``data`` begun."""
        startup = cls(records, main, clock)
        startup.times = entry_times(os.environ if environ is None else environ, startup._since)
        startup._announce("data")
        return startup

    def begin(self, phase: Phase) -> None:
        """``phase`` begins now: the phase before it has ended and is timed."""
        now = self.clock()
        self.times = self.times.model_copy(update={_ENDED_BY[phase]: _seconds(self._since, now)})
        self._since = now
        self._announce(phase)

    def _announce(self, phase: Phase) -> None:
        self.phase = phase
        if not self.main:
            return
        log.info("start-up: %s (%s)", _LOG_TEXT[phase], times_text(self.times) or "no phase timed yet")
        self.records.phase(phase, self.times.as_record())
