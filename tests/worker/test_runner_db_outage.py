"""The runner through a database outage: the run goes on, failed writes are retried, the lease bounds it.

Regression for the fault-injection test "PostgreSQL stopped during a job"
(tests/e2e/test_service_faults.py): the first ``OperationalError`` of a poll used
to fail the job ``worker_error`` and kill a healthy run, and the records read in
that poll were lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.exc import OperationalError
from worker_support import MakeJob, fake_command, present, small_spec

from halfcast.contracts.status import JobStatus
from halfcast.core.db.models import Attempt, Job, StepRow
from halfcast.core.settings import Settings
from worker.launch.process_tree import session_members
from worker.runner import Outcome, RunnerContext, run_job
from worker.store import JobStore

#: Store methods the runner calls while a job runs; all fail while the database is "down".
WRITES = ("mark_running", "record_progress", "renew_lease", "status", "finish")


class Outage:
    """Makes the store's methods raise ``OperationalError`` while :attr:`down` is set."""

    def __init__(self, store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.down = threading.Event()
        self.failures = 0
        for name in WRITES:
            monkeypatch.setattr(store, name, self._guard(getattr(store, name)))

    def _guard(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self.down.is_set():
                self.failures += 1
                raise OperationalError("UPDATE jobs", {}, ConnectionRefusedError("connection refused"))
            return method(*args, **kwargs)

        return guarded


def _row(engine: Engine, job_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(Job).where(Job.id == job_id)).one()


def _steps(engine: Engine, job_id: str) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(select(StepRow.step).where(StepRow.job_id == job_id).order_by(StepRow.step)).scalars())


def _attempts(engine: Engine, job_id: str) -> list[tuple[int, str | None]]:
    with engine.connect() as conn:
        return [(r.attempt, r.status) for r in conn.execute(select(Attempt).where(Attempt.job_id == job_id)).all()]


def _wait_until(predicate: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _start(job_id: str, settings: Settings, store: JobStore) -> tuple[threading.Thread, list[Outcome | None]]:
    context = RunnerContext(settings=settings, store=store, worker_id="test-worker", build_command=fake_command)
    result: list[Outcome | None] = []
    thread = threading.Thread(target=lambda: result.append(run_job(job_id, context)))
    thread.start()
    return thread, result


def _leader(engine: Engine, job_id: str) -> int:
    return int((Path(_row(engine, job_id).run_dir) / "trainer.pid").read_text())


def test_an_outage_mid_run_loses_no_record_and_the_job_succeeds(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    outage = Outage(store, monkeypatch)
    job_id = make_job(small_spec(max_steps=60, faults={"sleep_per_step_s": 0.05}))
    thread, result = _start(job_id, settings, store)
    _wait_until(lambda: _row(engine, job_id).step >= 2)
    outage.down.set()
    time.sleep(1.0)  # ~20 steps written while every database call fails
    assert thread.is_alive() and session_members(_leader(engine, job_id)), "the run was stopped"
    outage.down.clear()
    thread.join(timeout=60)
    assert outage.failures > 0 and result == [Outcome(JobStatus.SUCCEEDED)]
    assert (_row(engine, job_id).status, _steps(engine, job_id)) == ("succeeded", list(range(1, 61)))
    assert _attempts(engine, job_id) == [(1, "succeeded")]


def test_an_outage_at_the_run_s_exit_is_retried_until_the_outcome_is_stored(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last records and the outcome are written once the database is back (within the lease)."""
    outage = Outage(store, monkeypatch)
    job_id = make_job(small_spec(max_steps=20, faults={"sleep_per_step_s": 0.02}))
    thread, result = _start(job_id, settings, store)
    _wait_until(lambda: _row(engine, job_id).status == "running")
    outage.down.set()
    leader = _leader(engine, job_id)
    _wait_until(lambda: not session_members(leader))  # the run ended while the database was down
    time.sleep(1.5)  # the runner retries its last writes meanwhile
    assert thread.is_alive()
    outage.down.clear()
    thread.join(timeout=30)
    assert result == [Outcome(JobStatus.SUCCEEDED)]
    assert (_row(engine, job_id).status, _steps(engine, job_id)) == ("succeeded", list(range(1, 21)))


def test_an_outage_past_the_lease_stops_the_run_and_writes_nothing(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Self-fencing: once the lease would have expired, the run stops (a reaper may relaunch the job)."""
    settings = settings.model_copy(update={"lease_ttl_s": 1.0})
    outage = Outage(store, monkeypatch)
    job_id = make_job(small_spec(max_steps=1000, faults={"sleep_per_step_s": 0.05}))
    thread, result = _start(job_id, settings, store)
    _wait_until(lambda: _row(engine, job_id).step >= 2)
    leader = _leader(engine, job_id)
    outage.down.set()
    thread.join(timeout=30)
    assert not thread.is_alive() and outage.down.is_set()  # it gave up while the database was still down
    assert result[0] is not None and result[0].reason == "worker_lost" and "lease" in present(result[0].message)
    assert session_members(leader) == []
    outage.down.clear()
    row = _row(engine, job_id)
    assert (row.status, row.attempt) == ("running", 1)  # left to the reaper: the lease has expired
