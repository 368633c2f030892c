"""A job's checkpoint files in the runs directory, as the API lists and serves them (torch-free).

The trainer writes ``<runs_dir>/<job_id>/attempt-<n>/checkpoints/step-<N>.pt`` every
``checkpoint_interval`` steps and when it stops early (cancel, preemption), and
``final.pt`` when it reaches ``max_steps`` (:mod:`trainer.run.checkpoint`). Each file is
written to a hidden temporary name and moved into place, so a file listed here is
complete. Only names matching :data:`halfcast.contracts.rundir.CHECKPOINT_NAME` are ever listed or
served, and only from the job's own attempt directories: a request cannot reach another path.

As with logs, the API reads *its* ``runs_dir``; with the API and the workers on
different hosts the runs directory must be shared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from halfcast.contracts.rundir import CHECKPOINT_NAME, FINAL_CHECKPOINT, JobRuns, checkpoint_step

__all__ = ["CHECKPOINT_NAME", "CheckpointFile", "final_step", "find_checkpoint", "list_checkpoints"]

_NAME = re.compile(CHECKPOINT_NAME)


@dataclass(frozen=True)
class CheckpointFile:
    """One checkpoint file of one attempt.

    ``step``: the attempted steps it holds (``final.pt``: the job's ``max_steps``, or the step early stopping ended it at);
    ``size_bytes`` and ``modified_at`` (UTC) from the file system.
    """

    attempt: int
    name: str
    step: int
    final: bool
    size_bytes: int
    modified_at: datetime
    path: Path


def final_step(max_steps: int, end_info: dict[str, object] | None) -> int:
    """The step ``final.pt`` holds: the succeeded run's ``end`` record's ``steps`` (an early stop), else ``max_steps``."""
    steps = (end_info or {}).get("steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and 0 < steps <= max_steps else max_steps


def _step_of(name: str, max_steps: int) -> int:
    step = checkpoint_step(name)
    return max_steps if step is None else step


def _describe(path: Path, attempt: int, max_steps: int) -> CheckpointFile | None:
    try:
        stat = path.stat()
    except FileNotFoundError:  # removed since the directory was read (a bf16 fallback prunes)
        return None
    return CheckpointFile(
        attempt=attempt,
        name=path.name,
        step=_step_of(path.name, max_steps),
        final=path.name == FINAL_CHECKPOINT,
        size_bytes=stat.st_size,
        modified_at=datetime.fromtimestamp(stat.st_mtime, UTC),
        path=path,
    )


def list_checkpoints(runs_dir: Path, job_id: str, max_steps: int) -> list[CheckpointFile]:
    """Every complete checkpoint of ``job_id``, by attempt, then step (``final.pt`` last in its attempt)."""
    found: list[CheckpointFile] = []
    runs = JobRuns.of(runs_dir, job_id)
    for attempt in runs.attempt_numbers():
        folder = runs.attempt(attempt).checkpoints
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            if _NAME.fullmatch(path.name) and path.is_file():
                described = _describe(path, attempt, max_steps)
                if described is not None:
                    found.append(described)
    return sorted(found, key=lambda c: (c.attempt, c.final, c.step))


def find_checkpoint(
    runs_dir: Path, job_id: str, name: str, max_steps: int, attempt: int | None = None
) -> CheckpointFile | None:
    """The file ``name`` of ``attempt`` (default: the newest attempt that has one), or ``None``.

    Raises:
        ValueError: ``name`` is not a checkpoint name (:data:`CHECKPOINT_NAME`).
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a checkpoint name (final.pt or step-<N>.pt)")
    runs = JobRuns.of(runs_dir, job_id)
    attempts = [attempt] if attempt is not None else list(reversed(runs.attempt_numbers()))
    for number in attempts:
        path = runs.attempt(number).checkpoints / name
        if path.is_file():
            described = _describe(path, number, max_steps)
            if described is not None:
                return described
    return None
