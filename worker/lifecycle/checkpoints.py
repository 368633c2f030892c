"""Find checkpoints: a spec's ``resume_from``, and where a retried job picks up again.

Checkpoints live in run directories, ``<runs_dir>/<job_id>/attempt-<n>/checkpoints/``.
A job id means its newest checkpoint: ``final.pt`` of the newest attempt that has
one, else that attempt's highest ``step-<N>.pt``. A file path, ``<job id>/<path>``,
must resolve (symbolic links followed) inside that job's directory, so a spec cannot
make the trainer read an arbitrary file or another job's; which jobs a spec may name
at all is checked for its owner first (:mod:`halfcast.core.registry.refs`). A retry
(:func:`retry_checkpoint`) resumes from the highest
``step-<N>.pt`` below ``max_steps`` of the job's earlier attempts (the trainer writes
each checkpoint atomically, so a file under that name is complete).
"""

from __future__ import annotations

from pathlib import Path

from halfcast.contracts.rundir import JobRuns, RunDir


class CheckpointUnavailable(Exception):
    """``resume_from`` names no usable checkpoint (typed reason ``checkpoint_unavailable``)."""


def resolve_resume(resume_from: str, runs_dir: Path) -> Path:
    """The checkpoint file that ``resume_from`` names.

    Raises:
        CheckpointUnavailable: nothing usable there, or a path outside ``runs_dir``.
    """
    root = runs_dir.resolve()
    job_id = resume_from.split("/", 1)[0]
    job_root = (root / job_id).resolve()
    candidate = (root / resume_from).resolve()
    if job_root.parent != root or not candidate.is_relative_to(job_root):
        raise CheckpointUnavailable(f"resume_from {resume_from!r} is outside the run directory of job {job_id!r}")
    if candidate.is_file():
        return candidate
    if candidate == job_root and candidate.is_dir():
        return _newest_checkpoint(candidate, resume_from)
    raise CheckpointUnavailable(f"resume_from {resume_from!r} is neither a known job nor a checkpoint file")


def _newest_checkpoint(job_dir: Path, job_id: str) -> Path:
    runs = JobRuns(job_dir)
    for number in reversed(runs.attempt_numbers()):
        found = _attempt_checkpoint(runs.attempt(number))
        if found is not None:
            return found
    raise CheckpointUnavailable(f"job {job_id} has no checkpoint to resume from")


def _attempt_checkpoint(run: RunDir) -> Path | None:
    if run.final_checkpoint.is_file():
        return run.final_checkpoint
    steps = run.step_checkpoints()
    return steps[-1][1] if steps else None


def retry_checkpoint(job_dir: Path, attempt: int, max_steps: int) -> tuple[Path, int] | None:
    """``(checkpoint, step)`` for attempt ``attempt`` of a job to resume from; ``None`` if there is none.

    Looks at ``step-<N>.pt`` with ``N < max_steps`` in the run directories of attempts
    before ``attempt`` under ``job_dir``; the highest ``N`` wins, the newest attempt on a
    tie. (A checkpoint at ``max_steps`` is a finished run: the trainer refuses to
    resume from it.)
    """
    runs = JobRuns(job_dir)
    found = [
        (step, number, path)
        for number in runs.attempt_numbers()
        if number < attempt
        for step, path in runs.attempt(number).step_checkpoints()
        if step < max_steps
    ]
    if not found:
        return None
    step, _, path = max(found, key=lambda candidate: candidate[:2])
    return path, step
