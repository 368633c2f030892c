"""Resolve a spec's ``resume_from`` (a job id, or a checkpoint file) to a checkpoint path.

Checkpoints live in run directories, ``<runs_dir>/<job_id>/attempt-<n>/checkpoints/``.
A job id means its newest checkpoint: ``final.pt`` of the newest attempt that has
one, else that attempt's highest ``step-<N>.pt``. A file path (absolute, or relative
to ``runs_dir``) must resolve inside ``runs_dir``, so a spec cannot make the trainer
read an arbitrary file.
"""

from __future__ import annotations

import re
from pathlib import Path

_ATTEMPT = re.compile(r"attempt-(\d+)$")
_STEP = re.compile(r"step-(\d+)\.pt$")


class CheckpointUnavailable(Exception):
    """``resume_from`` names no usable checkpoint (typed reason ``checkpoint_unavailable``)."""


def resolve_resume(resume_from: str, runs_dir: Path) -> Path:
    """The checkpoint file that ``resume_from`` names.

    Raises:
        CheckpointUnavailable: nothing usable there, or a path outside ``runs_dir``.
    """
    root = runs_dir.resolve()
    candidate = (root / resume_from).resolve()
    if not candidate.is_relative_to(root) or candidate == root:
        raise CheckpointUnavailable(f"resume_from {resume_from!r} is outside the runs directory")
    if candidate.is_file():
        return candidate
    if candidate.parent == root and candidate.is_dir():
        return _newest_checkpoint(candidate, resume_from)
    raise CheckpointUnavailable(f"resume_from {resume_from!r} is neither a known job nor a checkpoint file")


def _newest_checkpoint(job_dir: Path, job_id: str) -> Path:
    attempts = sorted(
        (int(m.group(1)), path) for path in job_dir.iterdir() if (m := _ATTEMPT.match(path.name))
    )
    for _, attempt in reversed(attempts):
        found = _attempt_checkpoint(attempt / "checkpoints")
        if found is not None:
            return found
    raise CheckpointUnavailable(f"job {job_id} has no checkpoint to resume from")


def _attempt_checkpoint(folder: Path) -> Path | None:
    if (folder / "final.pt").is_file():
        return folder / "final.pt"
    steps = sorted((int(m.group(1)), p) for p in folder.glob("step-*.pt") if (m := _STEP.match(p.name)))
    return steps[-1][1] if steps else None
