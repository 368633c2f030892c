"""Re-sending the messages of queued jobs when the Redis broker lost its data.

A queued job lives in two places: its row (``queued``, no owner) and one broker
message. Redis without persistence loses every message when it restarts or is
flushed, and such a job would then wait ``queued`` for ever. The database is the
truth, so a lost broker is repaired from it.

Detection: a *marker* key ``halfcast:broker-epoch:<queue>`` lives in the broker's
own Redis database. Whatever wipes the messages wipes the marker too, so a missing
marker means "messages may have been lost". Every worker's reaper looks once per
pass (one ``GET``); the worker that wins a short lock (``SET NX EX``) sends one new
message for every ``queued`` job without an owner, then writes a new marker. A
worker that dies mid-way leaves the lock to expire and the marker unset, so another
one repeats the pass. A duplicate message is harmless: the claim's compare-and-set
runs a job once and drops the rest (celery#5935). The first pass of a fresh broker
finds no marker either and re-sends what is queued, a one-off duplicate.

The embedded ``filesystem://`` broker keeps its messages on disk and needs no watch.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import Engine, select

from halfcast.core.db.models import Job

if TYPE_CHECKING:
    import redis

log = logging.getLogger(__name__)

#: Seconds the re-send lock lives: a worker that dies holding it delays the repair this long.
RESEND_LOCK_TTL_S = 60
#: Broker URL schemes whose data lives in a Redis database this module can reach.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


class MarkerStore(Protocol):
    """The few Redis commands the watch uses (``redis.Redis`` satisfies it)."""

    def get(self, name: str) -> bytes | str | None:
        """The value of ``name``, or ``None`` if it does not exist."""
        ...

    def set(self, name: str, value: str, *, nx: bool = False, ex: int | None = None) -> bool | str | bytes | None:
        """Set ``name``; with ``nx`` only if absent (``None`` when it existed); ``ex``: TTL in seconds."""
        ...

    def delete(self, *names: str) -> int:
        """Remove the keys; the number removed."""
        ...


def marker_key(queue_name: str) -> str:
    """The Redis key whose absence means the broker lost the messages of ``queue_name``."""
    return f"halfcast:broker-epoch:{queue_name}"


def queued_job_ids(engine: Engine) -> list[str]:
    """Ids of the jobs waiting in ``queued`` with no owner, oldest first (the ones a broker message stands for)."""
    query = select(Job.id).where(Job.status == "queued", Job.worker_id.is_(None)).order_by(Job.created_at)
    with engine.connect() as conn:
        return [row.id for row in conn.execute(query)]


class BrokerWatch:
    """Detects a broker that lost its data (marker gone) and re-sends one message per queued job.

    ``queued`` lists the job ids to re-send; ``enqueue`` sends one (raising on failure).
    """

    def __init__(
        self, redis: MarkerStore, queue_name: str, queued: Callable[[], Sequence[str]], enqueue: Callable[[str], None]
    ) -> None:
        self.redis = redis
        self.key = marker_key(queue_name)
        self.lock_key = f"{self.key}:resending"
        self.queued = queued
        self.enqueue = enqueue

    def check(self) -> list[str] | None:
        """One look: ``None`` if the marker is there (or another worker is repairing), else the ids re-sent.

        Raises the Redis client's or the database's errors (the reaper logs them and
        tries again on its next pass); the marker is written only after every message
        went out, so a pass that failed half-way is repeated.
        """
        if self.redis.get(self.key) is not None:
            return None
        token = uuid.uuid4().hex
        if not self.redis.set(self.lock_key, token, nx=True, ex=RESEND_LOCK_TTL_S):
            return None
        try:
            job_ids = list(self.queued())
            for job_id in job_ids:
                self.enqueue(job_id)
            self.redis.set(self.key, token)
        finally:
            self.redis.delete(self.lock_key)
        if job_ids:
            log.warning(
                "the broker lost its data (marker %s was gone): sent the %d queued jobs again: %s",
                self.key,
                len(job_ids),
                ", ".join(job_ids),
            )
        return job_ids


def redis_marker_store(broker_url: str) -> redis.Redis | None:
    """A Redis client on the broker's own database, or ``None`` for a broker that is not Redis (the marker store
    here, the queue reader of :mod:`worker.messages.message_audit`)."""
    if not broker_url.startswith(REDIS_SCHEMES):
        return None
    import redis  # only a Redis deployment needs the client

    return redis.Redis.from_url(broker_url, socket_timeout=5.0, socket_connect_timeout=5.0)
