"""The worker roster on SQLite and PostgreSQL: register (upsert), heartbeat, prune the dead, deregister."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

from sqlalchemy import Engine, delete, select, update
from sqlalchemy.orm import Session

from halfcast.common.timeutil import as_utc
from halfcast.core.db.models import Worker, utcnow
from worker.roster import Heartbeat, WorkerInfo, WorkerRoster


def _rows(engine: Engine) -> dict[str, Worker]:
    with Session(engine) as session:  # detached copies
        return {worker.id: worker for worker in session.scalars(select(Worker))}


def _age(engine: Engine, worker_id: str, seconds: float) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(Worker).where(Worker.id == worker_id).values(heartbeat_at=utcnow() - timedelta(seconds=seconds))
        )


def _roster(engine: Engine, worker_id: str = "halfcast@a/11", gpus: tuple[int, ...] = (0, 1)) -> WorkerRoster:
    info = WorkerInfo(
        worker_id,
        "host-a",
        11,
        gpus,
        concurrency=3,
        started_at=datetime(2030, 1, 1, tzinfo=utcnow().tzinfo),
        model_roots=["/srv/models"],
        data_roots=["/srv/data", "/mnt/data"],
    )
    return WorkerRoster(engine, info, forget_s=60.0)


def test_register_is_an_upsert_and_heartbeat_moves_the_clock(db: Engine) -> None:
    roster = _roster(db)
    roster.register()
    roster.register()  # again (a restart of the heartbeat): still one row
    row = _rows(db)["halfcast@a/11"]
    assert (row.hostname, row.pid, row.gpus, row.concurrency) == ("host-a", 11, [0, 1], 3)
    assert (row.model_roots, row.data_roots) == (["/srv/models"], ["/srv/data", "/mnt/data"])  # the API judges paths
    assert as_utc(row.started_at) == datetime(2030, 1, 1, tzinfo=utcnow().tzinfo)
    _age(db, "halfcast@a/11", 30)
    roster.heartbeat()
    assert utcnow() - as_utc(_rows(db)["halfcast@a/11"].heartbeat_at) < timedelta(seconds=5)


def test_heartbeat_prunes_long_silent_workers_and_re_registers_itself(db: Engine) -> None:
    alive, dead, quiet = _roster(db), _roster(db, "halfcast@b/22", ()), _roster(db, "halfcast@c/33", (0,))
    for roster in (alive, dead, quiet):
        roster.register()
    _age(db, "halfcast@b/22", 61)  # past forget_s
    _age(db, "halfcast@c/33", 30)  # not live any more, but not forgotten
    with db.begin() as conn:
        conn.execute(delete(Worker).where(Worker.id == "halfcast@a/11"))  # e.g. pruned while partitioned
    assert alive.heartbeat() == 1
    assert set(_rows(db)) == {"halfcast@a/11", "halfcast@c/33"}
    alive.deregister()
    assert set(_rows(db)) == {"halfcast@c/33"}


def test_the_heartbeat_thread_registers_beats_and_deregisters_on_stop(db: Engine) -> None:
    stop = threading.Event()
    heartbeat = Heartbeat(_roster(db), 0.05, stop)
    heartbeat.start()
    assert "halfcast@a/11" in _rows(db)  # registered before start() returns
    first = as_utc(_rows(db)["halfcast@a/11"].heartbeat_at)
    deadline = time.monotonic() + 5
    while as_utc(_rows(db)["halfcast@a/11"].heartbeat_at) == first and time.monotonic() < deadline:
        time.sleep(0.05)
    assert as_utc(_rows(db)["halfcast@a/11"].heartbeat_at) > first
    stop.set()
    assert heartbeat.join(5.0)
    assert _rows(db) == {}


def test_a_database_error_never_kills_the_heartbeat(db: Engine, monkeypatch) -> None:
    roster = _roster(db)
    calls: list[int] = []

    def down() -> int:
        calls.append(1)
        raise ConnectionError("database down")

    monkeypatch.setattr(roster, "heartbeat", down)
    stop = threading.Event()
    heartbeat = Heartbeat(roster, 0.02, stop)
    heartbeat.start()
    time.sleep(0.2)
    assert heartbeat.thread is not None and heartbeat.thread.is_alive() and len(calls) >= 2
    stop.set()
    assert heartbeat.join(5.0)
