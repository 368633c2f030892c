"""The task takes a slot before claiming: a GPU job whose device is busy goes back to the queue, unclaimed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from worker_support import insert_job, small_spec

from halfcast.core.broker.celery_app import create_celery_app
from halfcast.core.db.engine import make_engine
from halfcast.core.db.models import Attempt, Base, Job, Worker
from halfcast.core.settings import Settings
from worker.__main__ import worker_argv
from worker.resources.gpu_locks import GpuLocks
from worker.tasks import register_tasks


@pytest.fixture
def gpu_settings(data_dir: Path) -> Settings:
    """A worker configured with HALFCAST_WORKER_GPUS="0" and a short wait for slots."""
    return Settings(
        data_dir=data_dir, worker_gpus="0", worker_slot_wait_s=0.2, worker_poll_interval_s=0.05, worker_heartbeat_s=0.05
    )


@pytest.fixture
def db_engine(gpu_settings: Settings) -> Engine:
    engine = make_engine(gpu_settings.effective_database_url)
    Base.metadata.create_all(engine)
    return engine


def _held_by(engine: Engine, job_id: str) -> str | None:
    with engine.connect() as conn:
        return conn.execute(select(Job.held_by).where(Job.id == job_id)).scalar_one()


def _job(engine: Engine, job_id: str) -> tuple[str, int, list[list[int] | None]]:
    with engine.connect() as conn:
        status, attempt = conn.execute(select(Job.status, Job.attempt).where(Job.id == job_id)).one()
        gpus = list(conn.execute(select(Attempt.gpus).where(Attempt.job_id == job_id)).scalars())
    return status, attempt, gpus


def test_a_gpu_job_is_handed_back_while_its_device_is_busy_then_runs_on_it(
    gpu_settings: Settings, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = register_tasks(create_celery_app(gpu_settings))
    handed_back: list[float] = []
    held: list[str | None] = []

    def retry(*, exc, countdown, throw=True):
        from celery.exceptions import Retry

        handed_back.append(countdown)
        held.append(_held_by(db_engine, job_id))  # the hold is still there while the new message goes out
        return Retry(exc=exc)

    monkeypatch.setattr(task, "retry", retry)
    job_id = insert_job(db_engine, {**small_spec(gpus=1), "bogus": 1})  # fails spec_invalid once claimed: no launch
    busy = GpuLocks(gpu_settings.resolved_gpu_lock_dir, [0]).try_acquire(1)  # another job holds GPU 0
    assert busy is not None
    assert task.apply(args=[job_id]).state == "RETRY"
    assert handed_back == [0] and _job(db_engine, job_id) == ("queued", 0, [])  # not claimed, no lease, no attempt
    assert held[0] is not None and held[0].endswith(f"/{os.getpid()}")
    assert _held_by(db_engine, job_id) is None  # the hand-back cleared this worker's hold
    busy.release()
    assert task.apply(args=[job_id]).get() == "failed"
    assert _job(db_engine, job_id) == ("failed", 1, [[0]])  # the attempt had GPU 0
    assert GpuLocks(gpu_settings.resolved_gpu_lock_dir, [0]).try_acquire(1) is not None  # released at the end


def test_the_pool_has_a_thread_per_cpu_slot_and_per_gpu(data_dir: Path) -> None:
    runtime = register_tasks(create_celery_app(Settings(data_dir=data_dir, worker_gpus="0,1,2", worker_concurrency=2)))
    threads = runtime.halfcast_runtime.slots().threads
    argv = worker_argv(Settings(worker_concurrency=2), [], threads)
    assert argv[argv.index("--concurrency") + 1] == "5"


def test_the_worker_registers_when_ready_and_deregisters_at_shutdown(gpu_settings: Settings, db_engine: Engine) -> None:
    task = register_tasks(create_celery_app(gpu_settings.model_copy(update={"worker_gpus": "0,1"})))
    runtime = task.halfcast_runtime

    class Consumer:
        hostname = "halfcast@test-host"

    runtime.on_ready(sender=Consumer())
    with db_engine.connect() as conn:
        row = conn.execute(select(Worker)).one()
    assert row.id == runtime.worker_id("halfcast@test-host") and (row.gpus, row.concurrency) == ([0, 1], 2)
    runtime.on_shutdown()
    runtime.on_stopped()
    with db_engine.connect() as conn:
        assert conn.execute(select(Worker)).all() == []
