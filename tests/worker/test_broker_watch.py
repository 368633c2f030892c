"""A broker that lost its data (Redis restarted without persistence, or flushed) gets the queued jobs' messages again.

Unit tests drive :class:`worker.messages.broker_watch.BrokerWatch` with an in-memory marker
store and the job tables on SQLite and PostgreSQL; one test uses the real Redis.
The whole path (worker down, Redis restarted, worker back: the job runs once) is in
``tests/e2e/test_service_faults.py``.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine
from worker_support import insert_job, small_spec

from worker.lifecycle.reaper import Reaper
from worker.lifecycle.recovery import Recovery
from worker.messages.broker_watch import BrokerWatch, marker_key, queued_job_ids, redis_marker_store
from worker.store import JobStore


class FakeRedis:
    """The marker commands on a dict (``ex`` is remembered, not enforced)."""

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}
        self.ttls: dict[str, int | None] = {}

    def get(self, name: str) -> bytes | None:
        value = self.keys.get(name)
        return None if value is None else value.encode()

    def set(self, name: str, value: str, nx: bool = False, ex: int | None = None) -> bool | None:
        if nx and name in self.keys:
            return None
        self.keys[name], self.ttls[name] = value, ex
        return True

    def delete(self, *names: str) -> int:
        return sum(self.keys.pop(name, None) is not None for name in names)


class Sent(list[str]):
    """An enqueue that remembers what it sent; raises for the ids in ``refuse``."""

    def __init__(self, refuse: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.refuse = refuse

    def __call__(self, job_id: str) -> None:
        if job_id in self.refuse:
            raise ConnectionError("broker refused")
        self.append(job_id)


def _watch(db: Engine, redis: FakeRedis, sent: Sent, queue: str = "q") -> BrokerWatch:
    return BrokerWatch(redis, queue, lambda: queued_job_ids(db), sent)


def test_a_missing_marker_resends_every_queued_job_once_then_rests(db: Engine, tmp_path: Path) -> None:
    queued = [insert_job(db, small_spec()) for _ in range(3)]
    running = insert_job(db, small_spec())
    assert JobStore(db).claim(running, "w/1", tmp_path) is not None
    insert_job(db, small_spec(), status="succeeded")
    redis, sent = FakeRedis(), Sent()
    watch = _watch(db, redis, sent)

    assert watch.check() == queued
    assert sent == queued  # oldest first; neither the claimed nor the finished job
    assert redis.get(marker_key("q")) is not None and watch.lock_key not in redis.keys
    assert watch.check() is None and sent == queued  # marker there: nothing more

    redis.keys.clear()  # FLUSHALL / a restart without persistence
    assert watch.check() == queued and sent == queued * 2


def test_another_worker_repairing_holds_the_lock(db: Engine) -> None:
    insert_job(db, small_spec())
    redis, sent = FakeRedis(), Sent()
    redis.set(f"{marker_key('q')}:resending", "other-worker", nx=True, ex=60)
    assert _watch(db, redis, sent).check() is None and sent == []


def test_a_pass_that_fails_half_way_is_repeated(db: Engine) -> None:
    first, second = insert_job(db, small_spec()), insert_job(db, small_spec())
    redis = FakeRedis()
    with pytest.raises(ConnectionError):
        _watch(db, redis, Sent(refuse=frozenset({second}))).check()
    assert redis.keys == {}  # no marker, lock released: the next pass tries again
    sent = Sent()
    assert _watch(db, redis, sent).check() == [first, second]


def test_the_lock_expires_if_its_holder_dies(db: Engine) -> None:
    redis = FakeRedis()
    _watch(db, redis, Sent()).check()
    assert redis.ttls[f"{marker_key('q')}:resending"] == 60


def test_the_reaper_runs_the_watch_each_pass(db: Engine) -> None:
    job_id = insert_job(db, small_spec())
    redis, sent, stop = FakeRedis(), Sent(), threading.Event()
    reaper = Reaper(Recovery(JobStore(db), sent), 0.05, stop, _watch(db, redis, sent))
    thread = reaper.start()
    try:
        for _ in range(100):
            if sent:
                break
            stop.wait(0.05)
        redis.keys.clear()
        for _ in range(100):
            if len(sent) == 2:
                break
            stop.wait(0.05)
    finally:
        stop.set()
        thread.join(5)
    assert sent == [job_id, job_id]


def test_embedded_broker_needs_no_watch() -> None:
    assert redis_marker_store("filesystem://") is None
    assert redis_marker_store("amqp://guest@localhost//") is None


@pytest.mark.redis
def test_the_marker_lives_in_the_brokers_own_redis_database(db: Engine, redis_url: str) -> None:
    redis = redis_marker_store(redis_url)
    assert redis is not None
    queue = f"test-{uuid.uuid4().hex[:8]}"
    job_id = insert_job(db, small_spec())
    sent = Sent()
    watch = BrokerWatch(redis, queue, lambda: queued_job_ids(db), sent)
    try:
        assert watch.check() == [job_id]
        assert watch.check() is None
        redis.delete(marker_key(queue))
        assert watch.check() == [job_id] and sent == [job_id, job_id]
    finally:
        redis.delete(marker_key(queue), watch.lock_key)
