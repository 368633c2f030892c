"""Which log explains a failed run: the failing rank's own ``rank-<r>.log`` when the rank is known.

The failing rank comes from ``error.json`` (the trainer writes its rank there) or,
without one, from torchrun's failure summary in ``launcher.log`` ("Root Cause (first
observed failure)" … ``rank : <r>``). Known causes (out of memory, collective
timeouts) are searched in the launcher log and in every rank's log, since each
rank's output now lives in its own file (:mod:`halfcast.contracts.rundir`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from halfcast.contracts.rundir import RunDir
from worker.launch.process_tree import log_tail

#: torchrun's report of the first rank that failed, under "Root Cause": ``rank : 1 (local_rank: 1)``,
#: then ``exitcode : -9 (pid: …)`` (negative: killed by that signal).
ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):\s*\[\d+\]:(?:\n[^\n]*){0,3}?\n\s*rank\s*:\s*(\d+)[^\n]*"
    r"(?:\n\s*exitcode\s*:\s*(-?\d+))?"
)


@dataclass(frozen=True)
class RootCause:
    """The rank torchrun saw fail first and its exit code (``None`` if not reported)."""

    rank: int
    exitcode: int | None


def root_cause(launcher_text: str) -> RootCause | None:
    """The root cause torchrun reports in ``launcher_text`` (the last report), else ``None``."""
    found = ROOT_CAUSE.findall(launcher_text)
    if not found:
        return None
    rank, exitcode = found[-1]
    return RootCause(int(rank), int(exitcode) if exitcode else None)


def failure_log(run_dir: Path, rank: int | None) -> Path:
    """The log to quote for a failure: ``rank``'s own log when known and not empty, else ``launcher.log``."""
    if rank is not None and rank >= 0:
        path = RunDir(run_dir).rank_log(rank)
        try:
            if path.stat().st_size > 0:
                return path
        except FileNotFoundError:
            pass
    return RunDir(run_dir).launcher_log


def scan_text(run_dir: Path, lines: int) -> str:
    """The last ``lines`` lines of ``launcher.log`` and of every ``rank-<r>.log``, joined (for cause patterns)."""
    run = RunDir(run_dir)
    paths = [run.launcher_log, *run.rank_logs()]
    return "\n".join(log_tail(path, lines) for path in paths)
