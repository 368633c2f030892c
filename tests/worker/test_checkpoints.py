"""Resolving ``resume_from`` to a checkpoint inside the runs directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.lifecycle.checkpoints import CheckpointUnavailable, resolve_resume


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def test_a_job_id_means_its_newest_attempts_newest_checkpoint(tmp_path: Path) -> None:
    _touch(tmp_path / "job" / "attempt-1" / "checkpoints" / "final.pt")
    _touch(tmp_path / "job" / "attempt-2" / "checkpoints" / "step-5.pt")
    newest = _touch(tmp_path / "job" / "attempt-2" / "checkpoints" / "step-20.pt")
    _touch(tmp_path / "job" / "attempt-10" / "logs" / "launcher.log")  # crashed before any checkpoint
    assert resolve_resume("job", tmp_path) == newest.resolve()
    final = _touch(tmp_path / "job" / "attempt-2" / "checkpoints" / "final.pt")
    assert resolve_resume("job", tmp_path) == final.resolve()


def test_a_checkpoint_file_inside_the_jobs_run_directory(tmp_path: Path) -> None:
    path = _touch(tmp_path / "job" / "attempt-1" / "checkpoints" / "step-3.pt")
    assert resolve_resume("job/attempt-1/checkpoints/step-3.pt", tmp_path) == path.resolve()


def test_an_absolute_path_is_refused_even_inside_the_runs_directory(tmp_path: Path) -> None:
    """Issue 24 item 1: a server path is never a reference; the job id comes first."""
    path = _touch(tmp_path / "job" / "attempt-1" / "checkpoints" / "step-3.pt")
    with pytest.raises(CheckpointUnavailable):
        resolve_resume(str(path), tmp_path)


def test_a_path_cannot_climb_from_one_job_into_another(tmp_path: Path) -> None:
    """The owner check is on the first part (the job id): ``mine/../theirs/...`` must not reach ``theirs``."""
    (tmp_path / "mine").mkdir()
    _touch(tmp_path / "theirs" / "attempt-1" / "checkpoints" / "final.pt")
    with pytest.raises(CheckpointUnavailable, match="outside the run directory of job 'mine'"):
        resolve_resume("mine/../theirs/attempt-1/checkpoints/final.pt", tmp_path)


@pytest.mark.parametrize(
    "resume_from", ["../secret.pt", "/etc/passwd", "job/../../secret.pt", ".", "nope", "job", "job/.."]
)
def test_refuses_escapes_and_unknown_names(tmp_path: Path, resume_from: str) -> None:
    runs = tmp_path / "runs"
    (runs / "job" / "attempt-1").mkdir(parents=True)
    _touch(tmp_path / "secret.pt")
    with pytest.raises(CheckpointUnavailable):
        resolve_resume(resume_from, runs)


def test_refuses_a_symlink_that_escapes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "job").mkdir()
    (runs / "job" / "link.pt").symlink_to(_touch(tmp_path / "outside.pt"))
    with pytest.raises(CheckpointUnavailable, match="outside"):
        resolve_resume("job/link.pt", runs)
