"""bench.trust_attacks' verdict: what counts as a re-run step, and what makes a replay unclean."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from bench.trust_attacks import Report
from bench.trust_workers import WorkerAttacks, rerun_steps


def _records(run_dir: Path, attempt: int, steps: range) -> None:
    folder = run_dir / f"attempt-{attempt}"
    folder.mkdir(parents=True)
    lines = [json.dumps({"type": "start"})] + [json.dumps({"type": "step", "step": step}) for step in steps]
    (folder / "records.jsonl").write_text("\n".join(lines) + '\n{"type": "st')  # a line still being written


def test_steps_an_attempt_trains_again_are_counted_once_per_repeat(tmp_path: Path) -> None:
    _records(tmp_path, 1, range(1, 11))
    _records(tmp_path, 2, range(6, 13))  # steps 6-10 again: the re-run the row lock caused before the fix
    assert rerun_steps(tmp_path) == 5


def test_a_resumed_attempt_that_goes_on_from_its_checkpoint_reruns_nothing(tmp_path: Path) -> None:
    _records(tmp_path, 1, range(1, 11))
    _records(tmp_path, 2, range(11, 21))
    assert rerun_steps(tmp_path) == 0


CLEAN = WorkerAttacks(
    rerun_steps=0,
    locked_job_status="succeeded",
    cancel_answer_s=0.4,
    cancelled_job_status="cancelled",
    two_node_status="succeeded",
)


def test_a_replay_with_nothing_through_is_clean() -> None:
    assert Report(quota_status=429, read_p99_ms=40.0, workers=CLEAN).clean(p99_ms=100)
    assert Report(quota_status=429, read_p99_ms=40.0, workers=None).clean(p99_ms=100)  # --no-workers


@pytest.mark.parametrize(
    "change",
    [
        {"rerun_steps": 50},
        {"cancel_answer_s": 74.0},
        {"locked_job_status": "failed"},
        {"cancelled_job_status": "succeeded"},
        {"two_node_status": "failed"},
    ],
)
def test_a_worker_attack_that_got_through_makes_the_replay_fail(change: dict[str, Any]) -> None:
    workers = dataclasses.replace(CLEAN, **change)
    assert not Report(quota_status=429, read_p99_ms=40.0, workers=workers).clean(p99_ms=100)


@pytest.mark.parametrize("change", [{"leaks": 1}, {"five_xx": 1}, {"staged_bytes_peak": 6}, {"quota_status": 201}])
def test_an_api_attack_that_got_through_makes_the_replay_fail(change: dict[str, Any]) -> None:
    report = dataclasses.replace(Report(quota_status=429, read_p99_ms=40.0), **change)
    assert not report.clean(p99_ms=100)
