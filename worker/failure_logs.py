"""Which log explains a failed run: the failing rank's own ``rank-<r>.log`` when the rank is known.

The failing rank comes from ``error.json`` (the trainer writes its rank there) or,
without one, from torchrun's failure summary in ``launcher.log`` ("Root Cause (first
observed failure)" … ``rank : <r>``). Known causes (out of memory, collective
timeouts) are searched in the launcher log and in every rank's log, since each
rank's output now lives in its own file (:mod:`server.runlogs`).
"""

from __future__ import annotations

import re
from pathlib import Path

from server.runlogs import launcher_log, logs_dir, rank_log
from worker.launch import log_tail

#: torchrun's report of the first rank that failed: ``rank : 1 (local_rank: 1)`` under "Root Cause".
ROOT_CAUSE_RANK = re.compile(r"Root Cause \(first observed failure\):\s*\[\d+\]:(?:\n[^\n]*){0,3}?\n\s*rank\s*:\s*(\d+)")


def root_cause_rank(launcher_text: str) -> int | None:
    """The rank torchrun names as the root cause in ``launcher_text`` (the last report), else ``None``."""
    found = ROOT_CAUSE_RANK.findall(launcher_text)
    return int(found[-1]) if found else None


def failure_log(run_dir: Path, rank: int | None) -> Path:
    """The log to quote for a failure: ``rank``'s own log when known and not empty, else ``launcher.log``."""
    if rank is not None and rank >= 0:
        path = rank_log(run_dir, rank)
        try:
            if path.stat().st_size > 0:
                return path
        except FileNotFoundError:
            pass
    return launcher_log(run_dir)


def scan_text(run_dir: Path, lines: int) -> str:
    """The last ``lines`` lines of ``launcher.log`` and of every ``rank-<r>.log``, joined (for cause patterns)."""
    paths = [launcher_log(run_dir), *sorted(logs_dir(run_dir).glob("rank-*.log"))]
    return "\n".join(log_tail(path, lines) for path in paths)
