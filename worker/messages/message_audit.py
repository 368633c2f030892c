"""Re-sending the message of a queued job that no broker queue holds any more.

A queued job waits on one broker message. A worker frozen (SIGSTOP, a paused VM, a swap
storm) at the instant Redis answers its ``BRPOP`` takes that message off the queue before it
has recorded anything: the message sits unread in the frozen process's socket, neither in
the queue nor in kombu's unacknowledged hash, and no hold names it (:mod:`worker.messages.holds`: the
task never ran). The job would wait ``queued`` until that worker runs again, for ever if it
never does. The same holds for a job whose message the API could not publish.

So every reaper pass reads the job ids of the messages in the queue (``LRANGE``) and in the
unacknowledged hash (``HVALS``). A queued job without owner or hold whose message is in
neither, in two passes in a row (a message is briefly in neither while a live worker reads
it), gets a new one. One worker audits at a time (a short ``SET NX`` lock); a duplicate
message (the frozen worker wakes) is dropped by the claim's compare-and-set. The cost is one
read of the queue per reaper interval, by one worker.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from sqlalchemy import Engine, select

from halfcast.core.db.models import Job

log = logging.getLogger(__name__)

#: kombu's Redis hash of delivered, unacknowledged messages (its ``unacked_key`` default).
UNACKED_KEY = "unacked"


class QueueReader(Protocol):
    """The Redis commands the audit uses (``redis.Redis`` satisfies it)."""

    def lrange(self, name: str, start: int, end: int) -> Any:
        """The elements of the list ``name`` from ``start`` to ``end``."""
        ...

    def hvals(self, name: str) -> Any:
        """The values of the hash ``name``."""
        ...

    def set(self, name: str, value: str, *, nx: bool = False, ex: int | None = None) -> bool | str | bytes | None:
        """Set ``name``; with ``nx`` only if absent (``None`` when it existed); ``ex``: TTL in seconds."""
        ...


def unowned_queued_job_ids(engine: Engine) -> list[str]:
    """Ids of the queued jobs with no owner and no hold: each should have a message in the broker."""
    query = select(Job.id).where(Job.status == "queued", Job.worker_id.is_(None), Job.held_by.is_(None))
    with engine.connect() as conn:
        return [row.id for row in conn.execute(query)]


def message_job_id(payload: bytes | str) -> str | None:
    """The job id a ``halfcast.run_job`` message carries (its first argument), or ``None`` if it is not one."""
    try:
        message = json.loads(payload)
        args = json.loads(base64.b64decode(message["body"]))[0]
    except (ValueError, KeyError, IndexError, TypeError, binascii.Error):
        return None
    return args[0] if isinstance(args, list) and args and isinstance(args[0], str) else None


def unacked_job_id(value: bytes | str) -> str | None:
    """The job id of an entry of kombu's unacknowledged hash (``[message, exchange, routing key]``)."""
    try:
        entry = json.loads(value)
    except ValueError:
        return None
    return message_job_id(json.dumps(entry[0])) if isinstance(entry, list) and entry else None


class MessageAudit:
    """Finds queued jobs whose message is nowhere in the broker (two passes in a row) and sends them a new one.

    ``queued`` lists the jobs that should have a message (:func:`unowned_queued_job_ids`);
    ``enqueue`` sends one (raising on failure); ``lock_s``: how long one worker's audit excludes the others'.
    """

    def __init__(
        self,
        redis: QueueReader,
        queue_name: str,
        queued: Callable[[], Sequence[str]],
        enqueue: Callable[[str], None],
        lock_s: int = 5,
    ) -> None:
        self.redis = redis
        self.queue_name = queue_name
        self.lock_key = f"halfcast:message-audit:{queue_name}"
        self.queued = queued
        self.enqueue = enqueue
        self.lock_s = lock_s
        #: The jobs whose message the last pass did not find.
        self.missing: frozenset[str] = frozenset()

    def broker_job_ids(self) -> set[str]:
        """The job ids of every message in the queue or delivered and unacknowledged."""
        waiting = (message_job_id(item) for item in self.redis.lrange(self.queue_name, 0, -1))
        delivered = (unacked_job_id(value) for value in self.redis.hvals(UNACKED_KEY))
        return {job_id for job_id in itertools.chain(waiting, delivered) if job_id is not None}

    def check(self) -> list[str]:
        """One pass: the ids of the jobs sent a new message (missing in this pass and the last)."""
        if not self.redis.set(self.lock_key, "1", nx=True, ex=self.lock_s):
            return []  # another worker audits now; this one's memory of the last pass is kept
        expected = set(self.queued())
        missing = expected - self.broker_job_ids()
        sent: list[str] = []
        try:
            for job_id in sorted(missing & self.missing):
                self.enqueue(job_id)
                sent.append(job_id)
        finally:
            self.missing = frozenset(missing - set(sent))  # one not sent is tried again next pass
        if sent:
            log.warning("queued jobs had no message in the broker (taken by a frozen worker?): sent again: %s", sent)
        return sent
