"""A gang's join message that a worker cannot use goes back to the queue, never dropped (issue 24 item 6).

Node 0 sends its job's message ``nodes - 1`` more times; with more than one slot, node 0's own
worker takes some of them. It cannot be another node of the gang, so it must hand each back for
another worker: a dropped message left a 2-node job ``gathering`` until ``gang_timeout_s``.
On SQLite and PostgreSQL (the ``db`` fixture).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from celery import Task
from celery.exceptions import Retry
from sqlalchemy import Engine
from worker_support import insert_job, small_spec

from halfcast.contracts.status import JobStatus
from halfcast.core.broker.celery_app import create_celery_app
from halfcast.core.db.members import Members
from halfcast.core.settings import Settings
from worker.gang.entry import GangEntry
from worker.resources.slots import Placement
from worker.runner import RunnerContext
from worker.store import JobStore
from worker.tasks import register_tasks

TTL = 30.0


def two_node_spec(gpus: int = 0) -> dict:
    return small_spec(nodes=2, processes=1, gpus=gpus, distributed={"timeout_s": 5, "gang_timeout_s": 5})


def claim_node0(engine: Engine, job_id: str, worker: str, tmp_path: Path) -> int:
    """Claim ``job_id`` as node 0 on ``worker`` (as :meth:`GangEntry._run_node0` does); its attempt."""
    claim = JobStore(engine).claim(job_id, worker, tmp_path, TTL, status=JobStatus.GATHERING)
    assert claim is not None
    assert Members(engine).open_node0(job_id, claim.attempt, worker, "127.0.0.1", 29400, TTL) is not None
    return claim.attempt


@pytest.fixture
def settings(data_dir: Path) -> Settings:
    """A worker with two CPU slots (the default of ``halfcast up`` and ``halfcast worker``)."""
    return Settings(data_dir=data_dir, worker_concurrency=2, worker_host_address="127.0.0.1")


@pytest.fixture
def task(settings: Settings, db: Engine, monkeypatch: pytest.MonkeyPatch) -> Task:
    """The run-job task on ``db``, with no pause before a hand-back; it must never run a membership here."""
    task = register_tasks(create_celery_app(settings))
    monkeypatch.setattr(task.halfcast_runtime, "_store", JobStore(db))
    monkeypatch.setattr("worker.tasks.HAND_BACK_PAUSE_S", 0.0)
    monkeypatch.setattr("worker.gang.entry.MemberRun.run", _must_not_join)
    return task


def _must_not_join(*_: object) -> None:
    raise AssertionError("the worker joined a gang it cannot be a node of")


def this_worker(task: Task) -> str:
    """The worker id of ``task.apply`` (Celery's eager request carries the host name)."""
    return str(task.halfcast_runtime.worker_id(socket.gethostname()))


@pytest.fixture
def handed_back(task: Task, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The countdowns of the task's hand-backs (Celery's retry, recorded instead of sent)."""
    countdowns: list[float] = []

    def retry(*, exc: Exception | None = None, countdown: float = 0, throw: bool = True) -> Retry:
        countdowns.append(countdown)
        return Retry(exc=exc)

    monkeypatch.setattr(task, "retry", retry)
    return countdowns


def test_node_0s_own_worker_hands_the_join_message_back_and_another_worker_joins(
    task: Task, handed_back: list[float], db: Engine, tmp_path: Path
) -> None:
    members = Members(db)
    job_id = insert_job(db, two_node_spec())
    node0 = this_worker(task)  # this worker: its first slot runs node 0
    attempt = claim_node0(db, job_id, node0, tmp_path)

    result = task.apply(args=[job_id])  # the join message, taken by the worker's second slot

    assert result.state == "RETRY" and handed_back == [0]  # back to the queue, not dropped
    assert [(m.node_rank, m.worker_id) for m in members.of_attempt(job_id, attempt)] == [(0, node0)]
    assert JobStore(db).status(job_id) == JobStatus.GATHERING
    other = GangEntry(task.halfcast_runtime.settings, members, lambda gpus: True)
    gang = other.gang_to_join(job_id, "other-host/7")  # the message handed back reaches another worker
    assert gang is not None and gang.job_id == job_id
    joined = members.join(job_id, "other-host/7", "127.0.0.2", TTL)
    assert joined is not None and joined.node_rank == 1


def test_a_worker_in_another_gang_or_without_a_slot_declines_and_the_message_goes_back(
    settings: Settings, db: Engine, tmp_path: Path
) -> None:
    members = Members(db)
    job_id, busy_job = insert_job(db, two_node_spec()), insert_job(db, two_node_spec())
    claim_node0(db, job_id, "w0/1", tmp_path)
    claim_node0(db, busy_job, "w1/1", tmp_path)  # w1 is node 0 of another gang
    entry = GangEntry(settings, members, lambda gpus: True)
    context = RunnerContext(settings=settings, store=JobStore(db), worker_id="w1/1")

    for worker in ("w0/1", "w1/1"):  # its own node 0, and node 0 of another gang
        gang = entry.gang_to_join(job_id, worker)
        assert gang is not None and gang.job_id == job_id  # the task hands the message back
        assert entry.join(gang, context, Placement()) is None
    gang = entry.gang_to_join(job_id, "w2/1")
    assert gang is not None
    assert entry.join(gang, RunnerContext(settings=settings, store=JobStore(db), worker_id="w2/1"), None) is None
    assert [m.node_rank for m in members.of_attempt(job_id, 1)] == [0]  # nobody joined, nothing lost


def test_a_gpu_gangs_message_taken_by_a_worker_without_gpus_goes_back(
    task: Task, handed_back: list[float], db: Engine, tmp_path: Path
) -> None:
    job_id = insert_job(db, two_node_spec(gpus=1))
    claim_node0(db, job_id, "gpu-host/1", tmp_path)

    assert task.apply(args=[job_id]).state == "RETRY" and handed_back == [0]
    assert [m.node_rank for m in Members(db).of_attempt(job_id, 1)] == [0]


def test_a_surplus_message_of_a_full_gang_is_still_dropped(
    task: Task, handed_back: list[float], db: Engine, tmp_path: Path
) -> None:
    job_id = insert_job(db, two_node_spec())
    claim_node0(db, job_id, this_worker(task), tmp_path)
    assert Members(db).join(job_id, "other-host/7", "127.0.0.2", TTL) is not None  # the gang is complete

    assert task.apply(args=[job_id]).get() is None and handed_back == []  # no endless round trips
