"""Message holds (worker/messages/holds.py): a queued job whose message a dead worker holds is sent again, once."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, insert, select, update
from worker_support import insert_job

from halfcast.core.db.models import Job, Worker, utcnow
from worker.messages.holds import MessageHolds
from worker.store import JobStore

LIVE_S = 15.0


def _register(engine: Engine, worker_id: str, heartbeat_age_s: float) -> None:
    beat = utcnow() - timedelta(seconds=heartbeat_age_s)
    with engine.begin() as conn:
        conn.execute(
            insert(Worker).values(
                id=worker_id, hostname="h", pid=1, gpus=None, concurrency=1, started_at=beat, heartbeat_at=beat
            )
        )


def _age_hold(engine: Engine, job_id: str, seconds: float) -> None:
    with engine.begin() as conn:
        conn.execute(update(Job).where(Job.id == job_id).values(held_at=utcnow() - timedelta(seconds=seconds)))


def _held_by(engine: Engine, job_id: str) -> str | None:
    with engine.connect() as conn:
        return conn.execute(select(Job.held_by).where(Job.id == job_id)).scalar_one()


def test_a_hold_is_taken_only_on_a_queued_job_and_cleared_only_by_its_holder(db: Engine) -> None:
    holds = MessageHolds(db)
    queued, running = insert_job(db), insert_job(db, status="running")
    assert holds.hold(queued, "w1/1") and not holds.hold(running, "w1/1")
    assert not holds.release(queued, "w2/2") and _held_by(db, queued) == "w1/1"  # another worker's hold stays
    assert holds.release(queued, "w1/1") and _held_by(db, queued) is None


def test_the_claim_clears_the_hold(db: Engine, tmp_path: Path) -> None:
    holds, job_id = MessageHolds(db), insert_job(db)
    holds.hold(job_id, "w1/1")
    assert JobStore(db).claim(job_id, "w1/1", tmp_path) is not None
    assert _held_by(db, job_id) is None


@pytest.mark.parametrize(
    ("registered_age_s", "hold_age_s", "stranded"),
    [
        (None, LIVE_S + 1, True),  # the holder has no roster row (gone, or forgotten)
        (LIVE_S + 1, LIVE_S + 1, True),  # its heartbeat is too old: not live
        (0.0, LIVE_S + 60, False),  # live: a long wait for a slot is its own business
        (None, 1.0, False),  # too recent: the holder may not have registered yet
    ],
)
def test_a_hold_is_stranded_when_its_worker_is_not_live(
    db: Engine, registered_age_s: float | None, hold_age_s: float, stranded: bool
) -> None:
    holds, job_id = MessageHolds(db), insert_job(db)
    if registered_age_s is not None:
        _register(db, "w1/1", registered_age_s)
    holds.hold(job_id, "w1/1")
    _age_hold(db, job_id, hold_age_s)
    assert [hold.job_id for hold in holds.stranded(LIVE_S)] == ([job_id] if stranded else [])


def test_a_stranded_job_is_sent_again_once_however_many_reapers_look(db: Engine) -> None:
    sent: list[str] = []
    job_id = insert_job(db)
    MessageHolds(db).hold(job_id, "dead/1")
    _age_hold(db, job_id, LIVE_S + 1)
    first, second = MessageHolds(db), MessageHolds(db)
    found = first.stranded(LIVE_S)
    assert second.recover(LIVE_S, sent.append) == [job_id]
    assert [first.resend(hold, sent.append) for hold in found] == [False]  # the other reaper won the CAS
    assert sent == [job_id] and _held_by(db, job_id) is None
    assert first.recover(LIVE_S, sent.append) == []


def test_a_resend_the_broker_refuses_keeps_the_hold_for_the_next_pass(db: Engine) -> None:
    job_id = insert_job(db)
    holds = MessageHolds(db)
    holds.hold(job_id, "dead/1")
    _age_hold(db, job_id, LIVE_S + 1)

    def refuse(_: str) -> None:
        raise ConnectionError("broker down")

    with pytest.raises(ConnectionError):
        holds.recover(LIVE_S, refuse)
    assert _held_by(db, job_id) == "dead/1"
    sent: list[str] = []
    assert holds.recover(LIVE_S, sent.append) == [job_id] and sent == [job_id]
