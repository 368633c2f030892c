"""JobStore: claim by compare-and-set, idempotent step records, terminal statuses stay terminal.

Runs on SQLite and on the real PostgreSQL (in a schema of its own).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_support import insert_job, small_spec
from sqlalchemy import Engine, create_engine, event, select, text

from server.db.engine import make_engine
from server.db.models import Base, Job, StepRecord
from worker.store import JobStore, Progress


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'jobs.db'}")
        Base.metadata.create_all(engine)
        yield engine
        engine.dispose()
        return
    yield from _postgres_schema(request.getfixturevalue("postgres_url"))


def _postgres_schema(url: str) -> Iterator[Engine]:
    schema = f"worker_store_{uuid.uuid4().hex[:10]}"
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))

    @event.listens_for(engine, "connect")
    def _search_path(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f'SET search_path TO "{schema}"')
        dbapi_connection.commit()

    engine.dispose()
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()
    cleanup = create_engine(make_engine(url).url)
    with cleanup.begin() as conn:
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    cleanup.dispose()


def _job(engine: Engine, job_id: str) -> Job:
    with engine.connect() as conn:
        return conn.execute(select(Job).where(Job.id == job_id)).one()  # type: ignore[return-value]


def _steps(engine: Engine, job_id: str) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(select(StepRecord.step).where(StepRecord.job_id == job_id).order_by(StepRecord.step)).scalars())


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
    records = [{"step": step, "time": 1000.0 + step, "loss": 1.0 / step} for step in range(1, 1201)]
    store.record_progress(job_id, 1, Progress(steps=records[:700], world_size=2))
    store.record_progress(job_id, 1, Progress(steps=records[600:]))  # overlap: re-read records
    assert _steps(db, job_id) == list(range(1, 1201))
    row = _job(db, job_id)
    assert row.step == 1200 and row.latest["step"] == 1200 and row.world_size == 2


def test_progress_keeps_eval_and_replaces_non_finite_numbers(db: Engine, tmp_path: Path) -> None:
    store = JobStore(db)
    job_id = insert_job(db)
    store.claim(job_id, "w", tmp_path)
    step = {"step": 1, "time": 1.0, "loss": float("nan"), "grad_norm": float("inf"), "overflow": True}
    store.record_progress(job_id, 1, Progress(steps=[step], eval={"step": 1, "loss": 0.5, "accuracy": 0.9}))
    row = _job(db, job_id)
    assert row.latest == {"step": 1, "time": 1.0, "loss": None, "grad_norm": None, "overflow": True}
    assert row.eval == {"step": 1, "loss": 0.5, "accuracy": 0.9}


def test_running_cancel_and_finish_are_compare_and_set(db: Engine, tmp_path: Path) -> None:
    store = JobStore(db)
    job_id = insert_job(db)
    store.claim(job_id, "w", tmp_path)
    assert store.mark_running(job_id, attempt=2) is False  # not this attempt
    assert store.mark_running(job_id, attempt=1) is True
    assert store.mark_running(job_id, attempt=1) is False
    assert store.cancel_requested(job_id) is False
    with db.begin() as conn:
        conn.execute(Job.__table__.update().where(Job.id == job_id).values(status="cancelling"))
    assert store.cancel_requested(job_id) is True
    assert store.finish(job_id, 1, "cancelled", None, "stopped") is True
    assert store.finish(job_id, 1, "failed", "rank_failed", "late") is False  # terminal stays terminal
    row = _job(db, job_id)
    assert (row.status, row.error_reason, row.error_message) == ("cancelled", None, "stopped")
    assert row.finished_at is not None
    store.record_progress(job_id, 1, Progress(steps=[{"step": 9, "time": 1.0}]))
    assert _job(db, job_id).step == 0  # no progress written to a terminal job
    with pytest.raises(ValueError):
        store.finish(job_id, 1, "running")


def test_finish_stores_a_typed_reason(db: Engine, tmp_path: Path) -> None:
    store = JobStore(db)
    job_id = insert_job(db, small_spec(name="x"))
    store.claim(job_id, "w", tmp_path)
    assert store.finish(job_id, 1, "failed", "rank_failed", "boom\ntrace") is True
    row = _job(db, job_id)
    assert (row.status, row.error_reason, row.error_message) == ("failed", "rank_failed", "boom\ntrace")
