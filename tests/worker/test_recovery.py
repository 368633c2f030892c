"""Recovery of lost attempts: the reaper requeues, cancels or fails jobs whose lease expired, once.

Runs on SQLite and on the real PostgreSQL (the ``db`` fixture).
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update
from worker_support import insert_job, job_row, present, small_spec

from halfcast.core.db.models import Attempt, Job, utcnow
from worker.lifecycle.reaper import Reaper
from worker.lifecycle.reasons import RETRY_POLICY, should_retry
from worker.lifecycle.recovery import Recovery, Resolution, attempt_status
from worker.store import Fence, JobStore


class Sent(list[str]):
    """An enqueue function that remembers what it sent."""

    def __call__(self, job_id: str) -> None:
        self.append(job_id)


def _job(engine: Engine, job_id: str) -> Job:
    return job_row(engine, job_id)


def _attempts(engine: Engine, job_id: str) -> list[tuple[int, str | None, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.attempt)).all()
    return [(r.attempt, r.status, r.reason) for r in rows]


def _claimed(engine: Engine, tmp_path: Path, status: str = "running", **spec: object) -> Fence:
    job_id = insert_job(engine, small_spec(**spec))
    claim = JobStore(engine).claim(job_id, "dead-worker/1", tmp_path)
    assert claim is not None
    _expire(engine, job_id, status)
    return claim.fence


def _expire(engine: Engine, job_id: str, status: str = "running") -> None:
    with engine.begin() as conn:
        past = utcnow() - timedelta(seconds=5)
        conn.execute(update(Job).where(Job.id == job_id).values(status=status, lease_expires_at=past))


def test_an_expired_lease_is_requeued_and_sent_again(db: Engine, tmp_path: Path) -> None:
    fence = _claimed(db, tmp_path)
    sent = Sent()
    reaper = Reaper(Recovery(JobStore(db), sent), 1.0, threading.Event())
    assert reaper.reap_once() == {fence.job_id: "requeued"}
    row = _job(db, fence.job_id)
    assert (row.status, row.worker_id, row.lease_expires_at, row.attempt, row.error_reason) == (
        "queued",
        None,
        None,
        1,
        None,
    )
    assert sent == [fence.job_id]
    assert _attempts(db, fence.job_id) == [(1, "failed", "worker_lost")]
    assert reaper.reap_once() == {}  # nothing left to recover
    claim = JobStore(db).claim(fence.job_id, "w2", tmp_path)
    assert claim is not None and claim.attempt == 2
    assert _attempts(db, fence.job_id) == [(1, "failed", "worker_lost"), (2, None, None)]


def test_a_graceful_shutdowns_attempt_is_requeued_not_failed(db: Engine, tmp_path: Path) -> None:
    """The worker's own release for ``worker_shutdown``: the job is queued again and the attempt says so."""
    fence = _claimed(db, tmp_path, max_attempts=1)
    sent = Sent()
    assert Recovery(JobStore(db), sent).release(fence, "worker_shutdown", "the worker shut down") == "requeued"
    assert _job(db, fence.job_id).status == "queued" and sent == [fence.job_id]
    assert _attempts(db, fence.job_id) == [(1, "requeued", "worker_shutdown")]
    second = _claimed_again(db, tmp_path, fence.job_id)
    assert (
        Recovery(JobStore(db), None).release(second, "worker_shutdown", "no broker") == "failed"
    )  # nobody takes it back
    assert _attempts(db, fence.job_id) == [(1, "requeued", "worker_shutdown"), (2, "failed", "worker_shutdown")]


@pytest.mark.parametrize(
    ("resolution", "reason", "status"),
    [("requeued", "worker_shutdown", "requeued"), ("requeued", "worker_lost", "failed"),
     ("failed", "worker_shutdown", "failed"), ("failed", "worker_lost", "failed"),
     ("cancelled", "worker_shutdown", "cancelled"), ("cancelled", "worker_lost", "cancelled")],
)  # fmt: skip  # a case table, laid out by hand
def test_attempt_status_is_requeued_only_for_a_handed_back_graceful_stop(
    resolution: Resolution, reason: str, status: str
) -> None:
    assert attempt_status(resolution, reason) == status


def _claimed_again(engine: Engine, tmp_path: Path, job_id: str) -> Fence:
    claim = JobStore(engine).claim(job_id, "w2/1", tmp_path)
    assert claim is not None
    return claim.fence


def test_without_attempts_left_the_job_fails_worker_lost(db: Engine, tmp_path: Path) -> None:
    fence = _claimed(db, tmp_path, max_attempts=1)
    sent = Sent()
    assert Reaper(Recovery(JobStore(db), sent), 1.0, threading.Event()).reap_once() == {fence.job_id: "failed"}
    row = _job(db, fence.job_id)
    assert (row.status, row.error_reason) == ("failed", "worker_lost") and row.finished_at is not None
    assert "dead-worker/1" in present(row.error_message) and "no retry left" in present(row.error_message)
    assert sent == [] and _attempts(db, fence.job_id) == [(1, "failed", "worker_lost")]


def test_an_expired_cancelling_job_is_cancelled(db: Engine, tmp_path: Path) -> None:
    fence = _claimed(db, tmp_path, status="cancelling")
    sent = Sent()
    assert Reaper(Recovery(JobStore(db), sent), 1.0, threading.Event()).reap_once() == {fence.job_id: "cancelled"}
    row = _job(db, fence.job_id)
    assert (row.status, row.error_reason, row.error_message) == ("cancelled", None, None) and sent == []
    assert _attempts(db, fence.job_id) == [(1, "cancelled", "worker_lost")]


def test_live_leases_and_other_jobs_are_left_alone(db: Engine, tmp_path: Path) -> None:
    store = JobStore(db)
    live = insert_job(db)
    assert store.claim(live, "alive/1", tmp_path, lease_ttl_s=60) is not None
    queued, done = insert_job(db), insert_job(db, status="succeeded")
    with db.begin() as conn:  # long past expiry, but not live: never touched
        conn.execute(update(Job).where(Job.id == done).values(lease_expires_at=utcnow() - timedelta(hours=1)))
    sent = Sent()
    assert Reaper(Recovery(store, sent), 1.0, threading.Event()).reap_once() == {}
    assert [_job(db, j).status for j in (live, queued, done)] == ["starting", "queued", "succeeded"] and sent == []


def test_a_lease_renewed_after_it_was_found_expired_is_kept(db: Engine, tmp_path: Path) -> None:
    fence = _claimed(db, tmp_path)
    recovery = Recovery(JobStore(db), Sent())
    [lease] = recovery.expired_leases()
    assert JobStore(db).renew_lease(fence, 30)  # the worker was only slow
    assert recovery.recover_expired(lease) is None
    assert _job(db, fence.job_id).status == "running"


def test_reapers_running_at_once_recover_each_job_once(db: Engine, tmp_path: Path) -> None:
    fences = [_claimed(db, tmp_path) for _ in range(5)]
    sent = Sent()
    barrier = threading.Barrier(4)
    results: list[dict[str, str]] = []

    def reap() -> None:
        reaper = Reaper(Recovery(JobStore(db), sent), 1.0, threading.Event())
        barrier.wait()
        results.append(dict(reaper.reap_once()))

    threads = [threading.Thread(target=reap) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(sent) == sorted(f.job_id for f in fences)  # one message per job
    assert sum(len(r) for r in results) == 5
    assert all(_attempts(db, f.job_id) == [(1, "failed", "worker_lost")] for f in fences)


def test_a_retry_that_cannot_be_sent_fails_the_job(db: Engine, tmp_path: Path) -> None:
    fence = _claimed(db, tmp_path)

    def broken(_: str) -> None:
        raise ConnectionError("broker down")

    assert (
        Recovery(JobStore(db), broken).recover_expired(Recovery(JobStore(db), None).expired_leases()[0]) == "requeued"
    )
    row = _job(db, fence.job_id)
    assert (row.status, row.error_reason) == ("failed", "enqueue_failed") and "broker down" in present(
        row.error_message
    )


def test_the_reaper_thread_runs_at_once_and_stops(db: Engine, tmp_path: Path) -> None:
    fence = _claimed(db, tmp_path)
    stop = threading.Event()
    sent = Sent()
    thread = Reaper(Recovery(JobStore(db), sent), 0.05, stop).start()
    deadline = utcnow() + timedelta(seconds=20)
    while not sent and utcnow() < deadline:
        stop.wait(0.02)
    stop.set()
    thread.join(timeout=10)
    assert sent == [fence.job_id] and not thread.is_alive()


@pytest.mark.parametrize(
    ("reason", "attempt", "retried"),
    [("worker_lost", 1, True), ("worker_lost", 3, False), ("oom", 1, False), ("nonfinite_gradients", 1, False),
     ("loss_scale_collapsed", 1, False), ("nonfinite_loss", 1, False), ("spec_invalid", 1, False),
     ("precision_unsupported", 1, False), ("no_such_reason", 1, False), (None, 1, False)],
)  # fmt: skip  # a case table, laid out by hand
def test_only_a_lost_worker_is_retried(reason: str | None, attempt: int, retried: bool) -> None:
    assert should_retry(reason, attempt, max_attempts=3) is retried


def test_the_retry_policy_covers_the_issue_reasons() -> None:
    required = {
        "spec_invalid",
        "launch_failed",
        "rank_failed",
        "oom",
        "nonfinite_gradients",
        "loss_scale_collapsed",
        "worker_lost",
        "deadline_exceeded",
        "collective_timeout",
    }
    assert required <= set(RETRY_POLICY)
    assert [reason for reason, retried in RETRY_POLICY.items() if retried] == ["worker_lost", "worker_shutdown"]
