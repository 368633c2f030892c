"""``halfcast.core.db.transitions``: the job state machine, and the one fenced compare-and-set, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from itertools import product
from typing import cast

import pytest
from sqlalchemy import Engine, select, update
from worker_support import insert_job

from halfcast.contracts.status import JobStatus
from halfcast.core.db.engine import WRITE_TRANSACTION
from halfcast.core.db.models import Job
from halfcast.core.db.transitions import (
    TRANSITIONS,
    Executor,
    Expected,
    Fence,
    IllegalTransition,
    Owner,
    allowed,
    compare_and_set,
    write_progress,
)

Q, G, ST, R, CG, OK, F, C = (
    JobStatus.QUEUED,
    JobStatus.GATHERING,
    JobStatus.STARTING,
    JobStatus.RUNNING,
    JobStatus.CANCELLING,
    JobStatus.SUCCEEDED,
    JobStatus.FAILED,
    JobStatus.CANCELLED,
)
#: Every status change a job may make, spelled out (docs/worker.md, "Job states"): claim, cancel, enqueue failure,
#: start, stop request, requeue, finish; a never-sent job replayed; nothing out of succeeded or cancelled; a
#: multi-node job's gang gathering, then starting, or back in the queue after its gang timeout.
ALLOWED_PAIRS = {
    (Q, ST), (Q, G), (Q, C), (Q, F),
    (G, ST), (G, CG), (G, Q), (G, OK), (G, F), (G, C),
    (ST, R), (ST, CG), (ST, Q), (ST, OK), (ST, F), (ST, C),
    (R, CG), (R, Q), (R, OK), (R, F), (R, C),
    (CG, OK), (CG, F), (CG, C),
    (F, Q),
}  # fmt: skip  # the allowed moves, a row per source status
FORBIDDEN_PAIRS = sorted(set(product(JobStatus, JobStatus)) - ALLOWED_PAIRS)


def test_the_table_is_exactly_the_allowed_pairs() -> None:
    assert {(source, target) for source, targets in TRANSITIONS.items() for target in targets} == ALLOWED_PAIRS
    assert set(TRANSITIONS) == set(JobStatus)


@pytest.mark.parametrize(("source", "target"), FORBIDDEN_PAIRS, ids=[f"{s}-{t}" for s, t in FORBIDDEN_PAIRS])
def test_a_forbidden_change_is_refused_before_any_write(source: JobStatus, target: JobStatus) -> None:
    assert not allowed(source, target)
    with pytest.raises(IllegalTransition) as refused:
        never_written = cast(Executor, None)  # refused before the database is touched
        compare_and_set(never_written, "no-such-job", Expected.of(source), to=target)
    assert (refused.value.source, refused.value.target) == (source, target)


def status_of(engine: Engine, job_id: str) -> str:
    with engine.connect() as conn:
        return conn.execute(select(Job.status).where(Job.id == job_id)).scalar_one()


def test_every_allowed_change_is_written(db: Engine) -> None:
    for source, target in sorted(ALLOWED_PAIRS):
        job_id = insert_job(db, status=source)
        with db.begin() as conn:
            assert compare_and_set(conn, job_id, Expected.of(source), to=target)
        assert status_of(db, job_id) == target


def test_succeeded_to_running_is_refused_and_the_row_unchanged(db: Engine) -> None:
    job_id = insert_job(db, status="succeeded")
    with db.begin() as conn, pytest.raises(IllegalTransition, match="from succeeded to running"):
        compare_and_set(conn, job_id, Expected.of("succeeded"), to=JobStatus.RUNNING)
    assert status_of(db, job_id) == "succeeded"


def test_a_write_whose_row_moved_on_loses(db: Engine) -> None:
    job_id = insert_job(db, status="running")
    with db.begin() as conn:
        assert not compare_and_set(conn, job_id, Expected.of(JobStatus.QUEUED), to=JobStatus.STARTING)
    assert status_of(db, job_id) == "running"


def test_of_two_racing_claimers_exactly_one_wins(db: Engine) -> None:
    job_id = insert_job(db)
    both_read = threading.Barrier(2)
    won: dict[str, bool] = {}

    def claim(worker: str) -> None:
        with db.execution_options(**WRITE_TRANSACTION).connect() as conn:
            attempt = conn.execute(select(Job.attempt).where(Job.id == job_id)).scalar_one()
            conn.rollback()  # end the read: SQLite's BEGIN IMMEDIATE comes with the write
            both_read.wait(timeout=30)
            with conn.begin():
                won[worker] = compare_and_set(
                    conn,
                    job_id,
                    Expected.of(JobStatus.QUEUED, attempt=attempt),
                    to=JobStatus.STARTING,
                    worker_id=worker,
                    attempt=attempt + 1,
                )

    threads = [threading.Thread(target=claim, args=(worker,)) for worker in ("host/1", "host/2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(won.values()) == [False, True]
    with db.connect() as conn:
        owner, attempt = conn.execute(select(Job.worker_id, Job.attempt).where(Job.id == job_id)).one()
    assert (owner, attempt) == (next(worker for worker, ok in won.items() if ok), 1)


def test_a_stale_fence_is_refused(db: Engine) -> None:
    job_id = insert_job(db, status="running")
    with db.begin() as conn:  # the job was recovered and claimed again: attempt 2 of host/2
        conn.execute(update(Job).where(Job.id == job_id).values(attempt=2, worker_id="host/2"))
    stale, other_owner, current = Fence(job_id, 1, "host/2"), Fence(job_id, 2, "host/1"), Fence(job_id, 2, "host/2")
    with db.begin() as conn:
        assert not compare_and_set(conn, job_id, Expected.fenced(stale), to=JobStatus.SUCCEEDED)
        assert not compare_and_set(conn, job_id, Expected.fenced(other_owner), to=JobStatus.SUCCEEDED)
        assert not compare_and_set(conn, job_id, Expected.of(R, attempt=2, owner=Owner.NONE), to=JobStatus.QUEUED)
    assert status_of(db, job_id) == "running"
    with db.begin() as conn:
        assert compare_and_set(conn, job_id, Expected.fenced(current), to=JobStatus.SUCCEEDED)
    assert status_of(db, job_id) == "succeeded"


def test_a_status_is_written_only_through_a_checked_change(db: Engine) -> None:
    job_id = insert_job(db, status="succeeded")
    with db.begin() as conn:
        with pytest.raises(TypeError, match="status"):
            compare_and_set(conn, job_id, Expected(None), status="running")
        with pytest.raises(TypeError, match="status"):
            write_progress(conn, job_id, status="running")
        with pytest.raises(TypeError, match="lease_expires_at"):
            write_progress(conn, job_id, lease_expires_at=None)
        with pytest.raises(ValueError, match="which statuses"):
            compare_and_set(conn, job_id, Expected(None), to=JobStatus.QUEUED)
    assert status_of(db, job_id) == "succeeded"
