"""Run one rank with its stdout and stderr in its own log file: ``python -m worker.launch.rank_output LOGS_DIR MODULE [ARGS...]``.

torchrun starts this module as each rank's entry point (``-m worker.launch.rank_output``).
It opens ``LOGS_DIR/rank-<RANK>.log`` (``RANK``: the global rank torchrun sets) for
appending, puts it on file descriptors 1 and 2, and replaces itself with
``python -u -m MODULE ARGS...`` (as torchrun would run MODULE; same pid, same
environment), so torchrun supervises and signals the rank exactly as if it had
started it directly, and the rank's output, stdout and stderr interleaved in the
order written, lands in one file per rank (:mod:`halfcast.contracts.rundir` names it).
Before the exec it writes the log's first line (the rank is starting, as the
trainer's imports take seconds) and puts the time in ``HALFCAST_RANK_STARTED_AT``
(the trainer's start-up clock, :mod:`trainer.startup`).
Imports nothing heavy (no torch): it runs in every rank.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from halfcast.contracts.rundir import rank_log_name
from trainer.startup import RANK_STARTED_AT_ENV

#: Exit status for a bad command line or a missing ``RANK``.
USAGE_EXIT = 2


def redirect_output(logs_dir: Path, rank: int) -> Path:
    """Point fds 1 and 2 at ``logs_dir/rank-<rank>.log`` (created, appended to). Raises ``OSError``."""
    logs_dir.mkdir(parents=True, exist_ok=True)
    path = logs_dir / rank_log_name(rank)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Redirect this rank's output, then exec ``python -m MODULE ARGS``; returns only on a usage error."""
    args = list(sys.argv[1:] if argv is None else argv)
    rank = os.environ.get("RANK", "")
    if len(args) < 2 or not rank.isdigit():
        sys.stderr.write(
            "usage: RANK=<r> python -m worker.launch.rank_output LOGS_DIR MODULE [ARGS...] (run by torchrun)\n"
        )
        return USAGE_EXIT
    logs_dir, module, rest = Path(args[0]), args[1], args[2:]
    redirect_output(logs_dir, int(rank))
    started = time.time()
    _note_start(int(rank), module, started)
    os.environ[RANK_STARTED_AT_ENV] = f"{started:.6f}"
    os.execv(sys.executable, [sys.executable, "-u", "-m", module, *rest])
    return 0  # not reached: execv replaces the process or raises


def _note_start(rank: int, module: str, now: float) -> None:
    """The log's first line, in the trainer's log format: the rank is starting (importing ``module``)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
    sys.stderr.write(
        f"{stamp} rank{rank} INFO worker.launch.rank_output: start-up: starting python -m {module} (imports)\n"
    )
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
