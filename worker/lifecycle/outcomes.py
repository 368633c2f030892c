"""How a run ended, as a terminal status with a typed reason (docs/architecture.md, "Typed failure reasons").

After the trainer exits: success needs exit 0 *and* the ``end`` record, and that record
must say the run applied at least one update (else ``no_update_applied``, whatever the
trainer decided: :mod:`worker.end_record`) and attempted ``max_steps`` steps, unless it
says early stopping ended it sooner (``stopped_early``; a short record without it is
``rank_failed``). Otherwise a
rank's ``error.json`` gives the reason; without one, the launcher log is searched
for a known cause (out of memory, a collective that timed out), and a rank killed by
SIGKILL while the kernel's OOM kill count rose is ``oom``; anything else is
``rank_failed``. Every failure message ends with the tail of the failing rank's own
``logs/rank-<r>.log`` when the rank is known (``error.json``, or torchrun's root-cause
report), else of ``logs/launcher.log`` (:mod:`worker.lifecycle.failure_logs`).
"""

from __future__ import annotations

import json
import logging
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from halfcast.contracts.error_file import ErrorFile
from halfcast.contracts.records import EndRecord
from halfcast.contracts.rundir import RunDir
from halfcast.contracts.status import FailureReason, JobStatus
from worker.launch.process_tree import log_tail
from worker.lifecycle.failure_logs import failure_log, root_cause, scan_text

log = logging.getLogger(__name__)

#: Lines of the failing rank's log (or ``launcher.log``) quoted in a failure message.
LOG_TAIL_LINES = 50
#: Lines quoted after a typed error (``error.json``): its own message says what went wrong, and the
#: lines before it are mostly the failing steps' warnings (all of them: ``GET /jobs/{id}/logs``).
TYPED_TAIL_LINES = 10
#: Lines of ``launcher.log`` and of each rank's log searched for a known cause.
SCAN_LINES = 2000

#: (reason, pattern, explanation): causes recognised in the log, first match wins (an OOM on one
#: rank often makes the others fail in a collective, so it is looked for first).
LOG_CAUSES: tuple[tuple[FailureReason, re.Pattern[str], str], ...] = (
    (FailureReason.OOM,
     re.compile(r"CUDA out of memory|HIP out of memory|OutOfMemoryError|DefaultCPUAllocator: can't allocate memory"),
     "a rank ran out of memory"),
    (FailureReason.COLLECTIVE_TIMEOUT, re.compile(
        r"Watchdog caught collective operation timeout|ran for \d+ milliseconds before timing out"
        r"|Timed out waiting \d+ ?ms for (?:recv|send) operation|ProcessGroup(?:NCCL|Gloo)\S*.{0,200}[Tt]imed? ?out"),
     "a collective operation timed out (a rank stopped taking part, or the network failed)"),
)  # fmt: skip  # one row per cause: reason, pattern, explanation
#: torchrun's report of a rank that died of SIGKILL.
RANK_SIGKILLED = re.compile(r"exitcode\s*:\s*-9\b|Signal 9 \(SIGKILL\) received")


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended: a terminal status and, for failures, a typed reason and message."""

    status: JobStatus
    reason: str | None = None
    message: str | None = None


def ended_outcome(end: EndRecord, max_steps: int | None = None) -> Outcome:
    """The outcome of a run that wrote its ``end`` record: ``succeeded`` only if it applied an update and
    attempted ``max_steps`` steps (when given) or stopped early at the step its record counts."""
    if (
        max_steps is not None
        and end.steps < max_steps
        and (end.stopped_early is None or end.stopped_early.step != end.steps)
    ):
        message = (
            f"the run's end record counts {end.steps} of {max_steps} steps without saying early stopping "
            "ended it there (stopped_early)"
        )
        return Outcome(JobStatus.FAILED, FailureReason.RANK_FAILED, message)
    if end.applied > 0:
        return Outcome(JobStatus.SUCCEEDED)
    message = (
        f"the run ended without applying any update: its end record counts {end.steps} attempted steps, "
        f"{end.skipped_steps} skipped" + ("" if end.applied_steps is None else f", {end.applied_steps} applied")
    )
    return Outcome(JobStatus.FAILED, FailureReason.NO_UPDATE_APPLIED, message)


def exit_outcome(
    code: int, end: EndRecord | None, run_dir: Path, oom_killed: bool = False, max_steps: int | None = None
) -> Outcome:
    """The outcome of a run whose launcher exited with ``code``.

    ``end``: the counts of the ``end`` record, if one was read (checked against ``max_steps``: :func:`ended_outcome`).
    ``oom_killed``: the kernel's OOM kill count rose while the run lived (see :mod:`worker.launch.oomwatch`).
    """
    if code == 0 and end is not None:
        return ended_outcome(end, max_steps)
    error = read_error(RunDir(run_dir).error)
    cause = root_cause(log_tail(RunDir(run_dir).launcher_log, SCAN_LINES))
    rank = error[2] if error is not None else cause.rank if cause is not None else None
    source = failure_log(run_dir, rank)
    label = f"logs/{source.name}"
    if error is not None:
        reason, message, _ = error
        return Outcome(JobStatus.FAILED, reason, with_tail(message, label, log_tail(source, TYPED_TAIL_LINES)))
    tail = log_tail(source, LOG_TAIL_LINES)
    what = "exited 0 without an end record" if code == 0 else f"exited with {describe_exit(code)}"
    if cause is not None:  # torchrun's own exit code says little; which rank died of what says more
        exit_text = f": {describe_exit(cause.exitcode)}" if cause.exitcode is not None else ""
        what += f" (rank {cause.rank} failed first{exit_text})"
    scan = scan_text(run_dir, SCAN_LINES)
    for reason, pattern, explanation in LOG_CAUSES:
        if pattern.search(scan):
            return Outcome(JobStatus.FAILED, reason, with_tail(f"the trainer {what}: {explanation}", label, tail))
    if oom_killed and (code == -signal.SIGKILL or RANK_SIGKILLED.search(scan)):
        explanation = "a rank was killed with SIGKILL while the kernel's OOM killer was active"
        return Outcome(
            JobStatus.FAILED, FailureReason.OOM, with_tail(f"the trainer {what}: {explanation}", label, tail)
        )
    return Outcome(JobStatus.FAILED, FailureReason.RANK_FAILED, with_tail(f"the trainer {what}", label, tail))


def read_error(path: Path) -> tuple[str, str, int | None] | None:
    """``(reason, message, rank)`` from a rank's ``error.json`` (:class:`~halfcast.contracts.error_file.ErrorFile`);
    ``None`` if absent, unreadable or without a reason."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        log.warning("unreadable %s", path)
        return None
    try:
        error = ErrorFile.model_validate(data)
    except ValidationError:
        log.warning("%s has no reason: %.200r", path, data)
        return None
    message = error.message or ""
    text = f"{message} (rank {error.rank})" if error.rank is not None else message
    return error.reason, text, error.rank


def with_tail(message: str, source: str, tail: str) -> str:
    """``message`` followed by the tail of the log ``source`` (e.g. ``logs/rank-1.log``), if any."""
    if not tail:
        return message
    return f"{message}\n--- last lines of {source} ---\n{tail}"


def describe_exit(code: int) -> str:
    """``exit code N`` or ``signal NAME`` for a ``Popen.returncode``."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
