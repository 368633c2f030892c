"""``bench/lease_under_load.py`` (issue 31, item 3): its verdict, and a short run against real training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.lease_under_load import Deadlines, LeaseReport, main


def _report(**deadlines: float) -> LeaseReport:
    watched = Deadlines(lease_ttl_s=30.0, worker_live_s=15.0)
    watched.add([deadlines.get("lease", 25.0)], deadlines.get("heartbeat", 1.0))
    return LeaseReport(jobs=1, duration_s=1.0, deadlines=watched, jobs_running_at_end=1)


def test_a_run_that_kept_every_deadline_passes() -> None:
    assert _report().problems == []


@pytest.mark.parametrize(
    ("missed", "problem"),
    [({"lease": 0.0}, "a lease expired"), ({"heartbeat": 15.0}, "the heartbeat was 15.00 s old")],
)
def test_an_expired_lease_or_a_stale_heartbeat_fails_the_run(missed: dict[str, float], problem: str) -> None:
    assert any(problem in line for line in _report(**missed).problems)


def test_a_lost_attempt_a_lost_lease_or_a_stopped_job_fails_the_run() -> None:
    report = _report()
    report.worker_lost_attempts, report.lease_lost_lines, report.jobs_running_at_end = 1, ["lost its lease"], 0
    assert len(report.problems) == 3


def test_no_sample_is_no_pass() -> None:
    report = LeaseReport(jobs=1, duration_s=1.0, deadlines=Deadlines(30.0, 15.0), jobs_running_at_end=1)
    assert report.problems == ["no lease or no heartbeat was ever seen"]


@pytest.mark.postgres
@pytest.mark.slow
def test_a_short_run_beside_real_training_keeps_every_deadline(tmp_path: Path, postgres_admin_url: str) -> None:
    """One CPU job for 6 s (the 5-minute run is in bench/README.md): sampled, training, nothing lost."""
    out = tmp_path / "lease.json"
    code = main(
        ["--jobs", "1", "--duration", "6", "--interval", "0.5", "--admin-url", postgres_admin_url, "--json", str(out)]
    )
    report = json.loads(out.read_text())
    assert code == 0, report["problems"]
    assert report["ok"] and report["deadlines"]["samples"] >= 8
    assert 0.0 < report["deadlines"]["min_lease_margin_s"] <= report["deadlines"]["lease_ttl_s"]
    assert report["steps_per_s"] > 0.0
