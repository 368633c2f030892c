"""A queued job whose message no broker queue holds (a worker took it and froze) gets a new one.

On the real Redis with real Celery messages (:class:`server.queue.CeleryJobQueue`): a frozen worker's
``BRPOP`` is replayed by popping the message with a plain client, so it is in neither the queue nor
kombu's unacknowledged hash. The multi-node e2e test that stops a host with SIGSTOP met this at random
(``test_a_gang_that_cannot_form_goes_back_to_queued``: the job stayed ``queued`` 60 s).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine, update
from worker_support import insert_job, small_spec

from halfcast.core.db.models import Job
from halfcast.core.settings import Settings
from server.queue import CeleryJobQueue
from worker.lifecycle.reaper import Reaper
from worker.lifecycle.recovery import Recovery
from worker.messages.message_audit import UNACKED_KEY, MessageAudit, message_job_id, unowned_queued_job_ids
from worker.store import JobStore

pytestmark = pytest.mark.redis


class Broker:
    """A queue of its own on the test's Redis database: real Celery messages, raw Redis reads."""

    def __init__(self, redis_url: str, tmp_path: Path) -> None:
        self.queue = f"audit-{uuid.uuid4().hex[:8]}"
        self.publisher = CeleryJobQueue(Settings(broker_url=redis_url, queue_name=self.queue, data_dir=tmp_path))
        self.redis = redis.Redis.from_url(redis_url)
        self.unacked: list[str] = []

    def job_ids(self) -> list[str | None]:
        return [message_job_id(item) for item in self.redis.lrange(self.queue, 0, -1)]

    def swallow(self) -> bytes:
        """Take the oldest message off the queue as a worker frozen mid-``BRPOP`` does."""
        popped = self.redis.rpop(self.queue)
        assert isinstance(popped, bytes)
        return popped

    def deliver(self) -> None:
        """Move the oldest message into the unacknowledged hash, as kombu does on delivery to a live worker."""
        payload = json.loads(self.swallow())
        tag = uuid.uuid4().hex
        self.redis.hset(UNACKED_KEY, tag, json.dumps([payload, "", self.queue]))
        self.unacked.append(tag)

    def close(self) -> None:
        self.redis.delete(self.queue)
        if self.unacked:
            self.redis.hdel(UNACKED_KEY, *self.unacked)
        self.redis.close()
        self.publisher.close()


@pytest.fixture
def broker(redis_url: str, tmp_path: Path) -> Iterator[Broker]:
    broker = Broker(redis_url, tmp_path)
    yield broker
    broker.close()


def _audit(broker: Broker, engine: Engine) -> MessageAudit:
    return MessageAudit(broker.redis, broker.queue, lambda: unowned_queued_job_ids(engine), broker.publisher.enqueue)


def test_a_swallowed_message_is_sent_again_after_two_passes(broker: Broker, engine: Engine) -> None:
    job_id = insert_job(engine, small_spec())
    broker.publisher.enqueue(job_id)
    assert broker.job_ids() == [job_id]
    broker.swallow()
    audit = _audit(broker, engine)
    assert audit.check() == []  # once could be a live worker reading it
    broker.redis.delete(audit.lock_key)  # the next reaper pass, after the lock's few seconds
    assert audit.check() == [job_id]
    assert broker.job_ids() == [job_id]
    broker.redis.delete(audit.lock_key)
    assert audit.check() == [] and audit.check() == []  # found again: nothing more


def test_a_message_waiting_or_delivered_is_never_sent_again(broker: Broker, engine: Engine) -> None:
    waiting, delivered = insert_job(engine, small_spec()), insert_job(engine, small_spec())
    broker.publisher.enqueue(delivered)
    broker.publisher.enqueue(waiting)
    broker.deliver()  # the oldest: ``delivered``
    audit = _audit(broker, engine)
    for _ in range(3):
        broker.redis.delete(audit.lock_key)
        assert audit.check() == []
    assert broker.job_ids() == [waiting]


def test_held_claimed_and_finished_jobs_need_no_message(broker: Broker, engine: Engine, tmp_path: Path) -> None:
    held, claimed = insert_job(engine, small_spec()), insert_job(engine, small_spec())
    insert_job(engine, small_spec(), status="succeeded")
    with engine.begin() as conn:
        conn.execute(update(Job).where(Job.id == held).values(held_by="w/1"))
    assert JobStore(engine).claim(claimed, "w/2", tmp_path) is not None
    assert unowned_queued_job_ids(engine) == []
    audit = _audit(broker, engine)
    for _ in range(2):
        broker.redis.delete(audit.lock_key)
        assert audit.check() == []


def test_a_job_missing_once_then_found_starts_counting_again(broker: Broker, engine: Engine) -> None:
    job_id = insert_job(engine, small_spec())  # the API's row is in before its message
    audit = _audit(broker, engine)
    assert audit.check() == []
    broker.publisher.enqueue(job_id)
    broker.redis.delete(audit.lock_key)
    assert audit.check() == []
    broker.swallow()
    broker.redis.delete(audit.lock_key)
    assert audit.check() == []  # missing once since it was found
    broker.redis.delete(audit.lock_key)
    assert audit.check() == [job_id]


def test_one_worker_audits_at_a_time(broker: Broker, engine: Engine) -> None:
    job_id = insert_job(engine, small_spec())
    first, second = _audit(broker, engine), _audit(broker, engine)
    assert first.check() == []
    assert second.check() == []  # the lock: no pass, so no memory either
    broker.redis.delete(first.lock_key)
    assert second.check() == []
    broker.redis.delete(first.lock_key)
    assert second.check() == [job_id]
    assert broker.redis.ttl(first.lock_key) > 0  # a dead auditor's lock expires


def test_what_is_not_a_job_message_is_ignored() -> None:
    assert message_job_id(b"not json") is None
    assert message_job_id(json.dumps({"body": "!!"})) is None
    assert message_job_id(json.dumps({"headers": {}})) is None


def test_the_reaper_audits_each_pass(engine: Engine) -> None:
    passes: list[int] = []
    stop = threading.Event()

    def audit() -> list[str]:
        passes.append(1)
        if len(passes) == 2:
            stop.set()
        return []

    reaper = Reaper(Recovery(JobStore(engine), lambda job_id: None), 0.01, stop, audit_messages=audit)
    reaper.start().join(5)
    assert len(passes) == 2
