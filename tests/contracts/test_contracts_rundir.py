"""The run directory's paths (``halfcast.contracts.rundir``): the layout docs/architecture.md describes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from halfcast.contracts.rundir import CHECKPOINT_NAME, FINAL_CHECKPOINT, ExportKind, JobRuns, RunDir, checkpoint_step


def test_every_path_of_an_attempt(tmp_path: Path) -> None:
    run = JobRuns.of(tmp_path / "runs", "job").attempt(2)
    root = tmp_path / "runs" / "job" / "attempt-2"
    assert run.path == root
    assert (run.spec, run.records, run.error) == (root / "spec.json", root / "records.jsonl", root / "error.json")
    assert run.step_checkpoint(40) == root / "checkpoints" / "step-40.pt"
    assert (run.final_checkpoint, run.best_checkpoint) == (
        root / "checkpoints" / "final.pt",
        root / "checkpoints" / "best.pt",
    )
    assert (run.rank_log(3), run.launcher_log) == (root / "logs" / "rank-3.log", root / "logs" / "launcher.log")
    assert (run.export_of("adapter"), run.export_of(ExportKind.MODEL)) == (
        root / "export" / "adapter",
        root / "export" / "model",
    )
    assert not root.exists()  # naming a path creates nothing


def test_bad_ranks_and_export_kinds_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        RunDir(tmp_path).rank_log(-1)
    with pytest.raises(ValueError):
        RunDir(tmp_path).export_of("weights")


def test_listings_read_only_the_names_the_trainer_writes(tmp_path: Path) -> None:
    runs = JobRuns.of(tmp_path, "job")
    assert runs.attempt_numbers() == [] and runs.attempt(1).step_checkpoints() == []
    for name in ("attempt-1", "attempt-10", "attempt-2", "attempt-x", "attempt-1.tmp"):
        (runs.path / name).mkdir(parents=True)
    (runs.path / "attempt-3").write_text("a file, not a run directory")
    assert runs.attempt_numbers() == [1, 2, 10]
    run = runs.attempt(1)
    run.checkpoints.mkdir()
    for name in ("step-20.pt", "step-3.pt", "final.pt", "best.pt", ".step-30.pt.tmp", "step-x.pt"):
        (run.checkpoints / name).write_bytes(b"")
    (run.checkpoints / "step-40.pt").mkdir()
    assert run.step_checkpoints() == [(3, run.step_checkpoint(3)), (20, run.step_checkpoint(20))]
    for name in ("rank-1.log", "rank-0.log", "launcher.log"):
        run.rank_log(0).parent.mkdir(exist_ok=True)
        (run.logs / name).write_text("")
    assert run.rank_logs() == [run.rank_log(0), run.rank_log(1)]


def test_the_served_checkpoint_names_are_the_written_ones(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    served = re.compile(CHECKPOINT_NAME)
    assert served.fullmatch(run.step_checkpoint(123).name) and served.fullmatch(FINAL_CHECKPOINT)
    assert not served.fullmatch(run.best_checkpoint.name)  # best.pt is not listed by the API
    assert checkpoint_step(run.step_checkpoint(123).name) == 123
    assert checkpoint_step(FINAL_CHECKPOINT) is None and checkpoint_step("step-1.pt.tmp") is None
