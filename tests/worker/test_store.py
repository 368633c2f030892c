"""JobStore: claim by compare-and-set with a lease, fenced writes, idempotent step records, terminal statuses stay terminal.

Runs on SQLite and on the real PostgreSQL (in a schema of its own).
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update
from worker_support import attempt_row, insert_job, job_row, present, small_spec

from halfcast.common.timeutil import as_utc
from halfcast.contracts.records import EvalRecord as EvalLine
from halfcast.contracts.records import StepRecord as StepLine
from halfcast.core.db.models import Attempt, EvalRow, Job, StepRow, utcnow
from worker.store import Fence, JobStore, Progress


def _job(engine: Engine, job_id: str) -> Job:
    return job_row(engine, job_id)


def _steps(engine: Engine, job_id: str, table: type[StepRow] | type[EvalRow] = StepRow) -> list[int]:
    """The steps of the job's stored records in ``table`` (step records by default), in order."""
    with engine.connect() as conn:
        return list(conn.execute(select(table.step).where(table.job_id == job_id).order_by(table.step)).scalars())


def test_claim_moves_a_queued_job_to_starting_once(db: Engine, tmp_path: Path) -> None:
    store = JobStore(db)
    job_id = insert_job(db)
    claim = store.claim(job_id, "w1", tmp_path / "runs")
    assert claim is not None and claim.attempt == 1
    assert claim.run_dir == tmp_path / "runs" / job_id / "attempt-1"
    row = _job(db, job_id)
    assert (row.status, row.worker_id, row.attempt, row.run_dir) == ("starting", "w1", 1, str(claim.run_dir))
    assert row.started_at is not None
    assert store.claim(job_id, "w2", tmp_path / "runs") is None  # duplicate message: dropped
    assert _job(db, job_id).worker_id == "w1"


def test_claim_drops_cancelled_and_unknown_jobs(db: Engine, tmp_path: Path) -> None:
    store = JobStore(db)
    assert store.claim(insert_job(db, status="cancelled"), "w", tmp_path) is None
    assert store.claim(str(uuid.uuid4()), "w", tmp_path) is None


def test_concurrent_claims_have_one_winner(db: Engine, tmp_path: Path) -> None:
    store = JobStore(db)
    job_id = insert_job(db)
    barrier = threading.Barrier(6)
    results: list[object] = []

    def claim(worker: str) -> None:
        barrier.wait()
        results.append(store.claim(job_id, worker, tmp_path))

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len([result for result in results if result is not None]) == 1
    assert _job(db, job_id).attempt == 1


def test_step_records_are_inserted_once_in_batches(db: Engine, tmp_path: Path) -> None:
    store = JobStore(db)
    job_id = insert_job(db)
    claim = store.claim(job_id, "w", tmp_path)
    assert claim is not None
    records = [StepLine(step=step, time=1000.0 + step, loss=1.0 / step) for step in range(1, 1201)]
    assert store.record_progress(claim.fence, Progress(steps=records[:700], world_size=2))
    assert store.record_progress(claim.fence, Progress(steps=records[600:]))  # overlap: re-read records
    assert _steps(db, job_id) == list(range(1, 1201))
    row = _job(db, job_id)
    assert row.step == 1200 and present(row.latest)["step"] == 1200 and row.world_size == 2


def test_progress_keeps_eval_and_replaces_non_finite_numbers(db: Engine, tmp_path: Path) -> None:
    store = JobStore(db)
    job_id = insert_job(db)
    fence = Fence(job_id, 1, "w")
    store.claim(job_id, "w", tmp_path)
    step = StepLine(step=1, time=1.0, loss=float("nan"), grad_norm=float("inf"), overflow=True)
    store.record_progress(fence, Progress(steps=[step], evals=[EvalLine(step=1, loss=0.5, accuracy=0.9)]))
    row = _job(db, job_id)
    assert row.latest == {"step": 1, "time": 1.0, "loss": None, "grad_norm": None, "overflow": True}
    assert row.eval == {"step": 1, "loss": 0.5, "accuracy": 0.9}


def test_running_cancel_and_finish_are_compare_and_set(db: Engine, tmp_path: Path) -> None:
    store = JobStore(db)
    job_id = insert_job(db)
    store.claim(job_id, "w", tmp_path)
    fence = Fence(job_id, 1, "w")
    assert store.mark_running(Fence(job_id, 2, "w")) is False  # not this attempt
    assert store.mark_running(Fence(job_id, 1, "other")) is False  # not this owner
    assert store.mark_running(fence) is True
    assert store.mark_running(fence) is False
    assert store.cancel_requested(job_id) is False
    with db.begin() as conn:
        conn.execute(update(Job).where(Job.id == job_id).values(status="cancelling"))
    assert store.cancel_requested(job_id) is True
    assert store.finish(fence, "cancelled", None, "stopped") is True
    assert store.finish(fence, "failed", "rank_failed", "late") is False  # terminal stays terminal
    row = _job(db, job_id)
    assert (row.status, row.error_reason, row.error_message) == ("cancelled", None, None)  # no error for a cancel
    assert row.finished_at is not None and row.lease_expires_at is None
    assert store.record_progress(fence, Progress(steps=[StepLine(step=9, time=1.0)])) is False
    assert _job(db, job_id).step == 0 and _steps(db, job_id) == []  # nothing written to a terminal job
    with pytest.raises(ValueError):
        store.finish(fence, "running")


def test_finish_stores_a_typed_reason(db: Engine, tmp_path: Path) -> None:
    store = JobStore(db)
    job_id = insert_job(db, small_spec(name="x"))
    store.claim(job_id, "w", tmp_path)
    assert store.finish(Fence(job_id, 1, "w"), "failed", "rank_failed", "boom\ntrace") is True
    row = _job(db, job_id)
    assert (row.status, row.error_reason, row.error_message) == ("failed", "rank_failed", "boom\ntrace")


def _attempts(engine: Engine, job_id: str) -> list[tuple[int, str, str | None, str | None, bool]]:
    with engine.connect() as conn:
        rows = conn.execute(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.attempt)).all()
    return [(r.attempt, r.worker_id, r.status, r.reason, r.ended_at is not None) for r in rows]


def test_the_claim_takes_a_lease_and_records_the_attempt(db: Engine, tmp_path: Path) -> None:
    store = JobStore(db)
    job_id = insert_job(db)
    before = utcnow()
    claim = store.claim(job_id, "w1", tmp_path, lease_ttl_s=30)
    assert claim is not None and claim.fence == Fence(job_id, 1, "w1") and claim.runtime_used_s == 0.0
    expires = as_utc(present(_job(db, job_id).lease_expires_at))
    assert before + timedelta(seconds=29) < expires < utcnow() + timedelta(seconds=31)
    assert _attempts(db, job_id) == [(1, "w1", None, None, False)]
    assert store.renew_lease(claim.fence, 120) is True
    assert as_utc(present(_job(db, job_id).lease_expires_at)) > utcnow() + timedelta(seconds=100)
    assert store.renew_lease(Fence(job_id, 1, "w2"), 120) is False  # not the owner
    assert store.renew_lease(Fence(job_id, 2, "w1"), 120) is False  # not the attempt
    assert store.finish(claim.fence, "failed", "rank_failed", "boom") is True
    assert store.renew_lease(claim.fence, 120) is False  # terminal: nothing to renew
    assert _attempts(db, job_id) == [(1, "w1", "failed", "rank_failed", True)]


def test_a_stale_attempt_writes_nothing_after_the_job_moved_on(db: Engine, tmp_path: Path) -> None:
    """Fencing: once the job was requeued and claimed again, attempt 1's worker cannot touch it."""
    store = JobStore(db)
    job_id = insert_job(db)
    old = store.claim(job_id, "w1", tmp_path)
    assert old is not None and store.record_progress(old.fence, Progress(steps=[StepLine(step=1, time=1.0)]))
    with db.begin() as conn:  # what a reaper does when w1's lease expires
        conn.execute(update(Job).where(Job.id == job_id).values(status="queued", worker_id=None))
    stale_step = Progress(steps=[StepLine(step=2, time=2.0, loss=9.0)])
    assert store.record_progress(old.fence, stale_step) is False  # requeued: no owner any more
    new = store.claim(job_id, "w2", tmp_path)
    assert new is not None and new.attempt == 2
    assert store.record_progress(old.fence, stale_step) is False
    assert store.mark_running(old.fence) is False
    assert store.renew_lease(old.fence, 30) is False
    assert store.finish(old.fence, "failed", "worker_lost", "stale") is False
    assert store.rewind(old.fence, 0) is False
    assert _steps(db, job_id) == [1] and _job(db, job_id).status == "starting"
    assert store.record_progress(new.fence, Progress(steps=[StepLine(step=2, time=3.0, loss=1.0)]))
    assert _steps(db, job_id) == [1, 2] and present(_job(db, job_id).latest)["loss"] == 1.0


def test_rewind_drops_records_after_the_resume_step(db: Engine, tmp_path: Path) -> None:
    store = JobStore(db)
    job_id = insert_job(db)
    claim = store.claim(job_id, "w", tmp_path)
    assert claim is not None
    records = [StepLine(step=step, time=float(step), loss=1.0 / step) for step in range(1, 11)]
    store.record_progress(claim.fence, Progress(steps=records, evals=[EvalLine(step=8, loss=0.5)]))
    assert store.rewind(claim.fence, 6) is True
    row = _job(db, job_id)
    assert _steps(db, job_id) == [1, 2, 3, 4, 5, 6]
    assert (row.step, present(row.latest)["step"], row.eval) == (6, 6, None)
    assert store.rewind(claim.fence, 0) is True
    assert _steps(db, job_id) == [] and _job(db, job_id).latest is None


def test_a_rewind_records_where_the_attempt_resumed(db: Engine, tmp_path: Path) -> None:
    store = JobStore(db)
    job_id = insert_job(db)
    first = store.claim(job_id, "w", tmp_path)
    assert first is not None and _attempt(db, job_id, 1).resumed_from_step is None  # a first attempt resumes nothing
    with db.begin() as conn:
        conn.execute(update(Job).where(Job.id == job_id).values(status="queued", worker_id=None))
    second = store.claim(job_id, "w", tmp_path)
    assert second is not None and store.rewind(second.fence, 6) is True
    assert (_attempt(db, job_id, 1).resumed_from_step, _attempt(db, job_id, 2).resumed_from_step) == (None, 6)


def _attempt(engine: Engine, job_id: str, attempt: int) -> Attempt:
    return attempt_row(engine, job_id, attempt)


def test_every_evaluation_is_kept_and_a_rewind_restores_the_one_before(db: Engine, tmp_path: Path) -> None:
    """The validation curve survives (``eval_records``); a rewind drops later evaluations and brings back the last one kept."""
    store = JobStore(db)
    job_id = insert_job(db)
    claim = store.claim(job_id, "w", tmp_path)
    assert claim is not None
    records = [StepLine(step=step, time=float(step), loss=1.0 / step) for step in range(1, 11)]
    evals = [EvalLine(step=step, time=float(step), loss=1.0 / step, accuracy=step / 10) for step in (3, 6, 9)]
    store.record_progress(claim.fence, Progress(steps=records[:5], evals=evals[:1]))
    store.record_progress(claim.fence, Progress(steps=records[5:], evals=evals[1:]))
    store.record_progress(claim.fence, Progress(evals=evals[1:2]))  # replayed after a lost write: ignored
    assert _steps(db, job_id, EvalRow) == [3, 6, 9] and present(_job(db, job_id).eval)["step"] == 9
    assert store.rewind(claim.fence, 7) is True
    assert _steps(db, job_id, EvalRow) == [3, 6] and _job(db, job_id).eval == evals[1].body()
    assert store.rewind(claim.fence, 2) is True
    assert _steps(db, job_id, EvalRow) == [] and _job(db, job_id).eval is None


def test_runtime_used_sums_the_ended_attempts(db: Engine, tmp_path: Path) -> None:
    store = JobStore(db)
    job_id = insert_job(db)
    first = store.claim(job_id, "w", tmp_path)
    assert first is not None
    with db.begin() as conn:
        start = utcnow() - timedelta(seconds=100)
        conn.execute(update(Attempt).values(started_at=start, ended_at=start + timedelta(seconds=40)))
        conn.execute(update(Job).where(Job.id == job_id).values(status="queued", worker_id=None))
    second = store.claim(job_id, "w", tmp_path)
    assert second is not None and second.attempt == 2
    assert second.runtime_used_s == pytest.approx(40.0)


def test_step_records_without_the_job_row_leave_the_row_alone_and_stay_fenced(db: Engine, tmp_path: Path) -> None:
    """``job_row=False`` (worker/records/pacing.py): the records are stored, the row is not written; fenced all the same."""
    store = JobStore(db)
    job_id = insert_job(db)
    claim = store.claim(job_id, "w1", tmp_path)
    assert claim is not None and store.record_progress(claim.fence, Progress(steps=[StepLine(step=1, time=1.0)]))
    before = _job(db, job_id)
    assert store.record_progress(claim.fence, Progress(steps=[StepLine(step=2, time=2.0)]), job_row=False)
    after = _job(db, job_id)
    assert _steps(db, job_id) == [1, 2]
    assert (after.step, after.latest, after.updated_at) == (before.step, before.latest, before.updated_at)
    with db.begin() as conn:  # a reaper requeued the job
        conn.execute(update(Job).where(Job.id == job_id).values(status="queued", worker_id=None))
    assert store.record_progress(claim.fence, Progress(steps=[StepLine(step=3, time=3.0)]), job_row=False) is False
    assert _steps(db, job_id) == [1, 2]
