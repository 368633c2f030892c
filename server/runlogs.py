"""Where a job's logs live in the runs directory (the worker writes them, the API reads them).

One directory per attempt, ``<runs_dir>/<job_id>/attempt-<n>/logs/``, holding

- ``rank-<r>.log``: everything rank ``r`` (global rank) wrote to stdout and stderr,
  in order (the worker starts each rank through :mod:`worker.rank_output`);
- ``launcher.log``: torchrun's own output (its failure summary names the failing rank).

A retry gets a new attempt directory, so the logs of earlier attempts are kept.
The API reads these files from *its* ``runs_dir``: with the API and the workers on
different hosts, the runs directory must be shared (docker-compose mounts the
``halfcast-data`` volume in both). Torch-free and import-light: the rank wrapper
imports it in every rank.
"""

from __future__ import annotations

from pathlib import Path

#: Folder of an attempt's run directory that holds its logs.
LOGS_DIR = "logs"
#: torchrun's own stdout and stderr.
LAUNCHER_LOG = "launcher.log"


def attempt_dir(runs_dir: Path, job_id: str, attempt: int) -> Path:
    """The run directory of attempt ``attempt`` (1-based) of ``job_id``."""
    return runs_dir / job_id / f"attempt-{attempt}"


def logs_dir(run_dir: Path) -> Path:
    """The logs folder of one attempt's run directory."""
    return run_dir / LOGS_DIR


def rank_log_name(rank: int) -> str:
    """``rank-<rank>.log``. Raises ``ValueError`` for a negative rank."""
    if rank < 0:
        raise ValueError(f"a rank is >= 0, not {rank}")
    return f"rank-{rank}.log"


def rank_log(run_dir: Path, rank: int) -> Path:
    """The log file of ``rank`` in one attempt's run directory."""
    return logs_dir(run_dir) / rank_log_name(rank)


def launcher_log(run_dir: Path) -> Path:
    """torchrun's own log in one attempt's run directory."""
    return logs_dir(run_dir) / LAUNCHER_LOG
