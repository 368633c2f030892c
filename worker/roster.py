"""The worker roster: each worker's row in ``workers``, kept fresh by a heartbeat thread.

On ``worker_ready`` a worker upserts its row (id = its lease owner id
``<hostname>/<pid>``, host, pid, GPUs, CPU concurrency, start time, model and data roots) and a daemon
thread renews ``heartbeat_at`` every ``HALFCAST_WORKER_HEARTBEAT_S``. The API calls
a worker *live* while its heartbeat is younger than ``HALFCAST_WORKER_LIVE_S``.
Each heartbeat also deletes rows whose heartbeat is older than
``HALFCAST_WORKER_FORGET_S`` (workers that died without deregistering). A clean
shutdown deletes the worker's own row. A heartbeat that finds its row gone (pruned
while this worker could not reach the database) inserts it again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, Update, delete, insert, update

from halfcast.core.db.engine import WRITE_TRANSACTION
from halfcast.core.db.models import Worker, utcnow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker registers: identity, host, process, GPU indices, CPU concurrency, start time (UTC)."""

    id: str
    hostname: str
    pid: int
    gpus: Sequence[int] = ()
    concurrency: int = 1
    started_at: datetime = field(default_factory=utcnow)
    #: Where its jobs read hf models and datasets (the API refuses a path none of them holds).
    model_roots: Sequence[str] = ()
    data_roots: Sequence[str] = ()


class WorkerRoster:
    """One worker's row in ``workers``: register, heartbeat, deregister; prune the dead."""

    def __init__(self, engine: Engine, info: WorkerInfo, forget_s: float) -> None:
        self.engine = engine
        self.info = info
        self.forget_s = forget_s

    def register(self) -> None:
        """Insert or refresh this worker's row (heartbeat now)."""
        with self._begin() as conn:
            if conn.execute(self._update()).rowcount == 0:
                conn.execute(insert(Worker).values(**self._row()))

    def heartbeat(self) -> int:
        """Renew ``heartbeat_at`` (re-register if the row is gone); return how many dead rows were pruned."""
        self.register()
        cutoff = utcnow() - timedelta(seconds=self.forget_s)
        with self._begin() as conn:
            pruned = conn.execute(delete(Worker).where(Worker.heartbeat_at < cutoff, Worker.id != self.info.id))
        if pruned.rowcount:
            log.info("worker roster: forgot %d worker(s) silent for over %.0f s", pruned.rowcount, self.forget_s)
        return pruned.rowcount or 0

    def deregister(self) -> None:
        """Delete this worker's row (clean shutdown)."""
        with self._begin() as conn:
            conn.execute(delete(Worker).where(Worker.id == self.info.id))

    def _begin(self) -> AbstractContextManager[Connection]:
        return self.engine.execution_options(**WRITE_TRANSACTION).begin()

    def _update(self) -> Update:
        return update(Worker).where(Worker.id == self.info.id).values(**self._row())

    def _row(self) -> dict[str, object]:
        info = self.info
        return {
            "id": info.id,
            "hostname": info.hostname,
            "pid": info.pid,
            "gpus": list(info.gpus),
            "concurrency": info.concurrency,
            "started_at": info.started_at,
            "heartbeat_at": utcnow(),
            "model_roots": list(info.model_roots),
            "data_roots": list(info.data_roots),
        }


class Heartbeat:
    """Registers the worker, then heartbeats every ``interval_s`` until ``stop`` is set; then deregisters.

    Deregistering in the heartbeat's own thread orders it after the last beat;
    :meth:`join` waits for it (a clean shutdown calls it before the process exits).
    """

    def __init__(self, roster: WorkerRoster, interval_s: float, stop: threading.Event) -> None:
        self.roster = roster
        self.interval_s = interval_s
        self.stop = stop
        self.thread: threading.Thread | None = None

    def beat(self) -> bool:
        """One heartbeat; ``False`` (logged, never raised) when the database could not be reached."""
        try:
            self.roster.heartbeat()
        except Exception:
            log.exception("worker roster: heartbeat of %s failed", self.roster.info.id)
            return False
        return True

    def run(self) -> None:
        """Heartbeat every ``interval_s`` until ``stop``, then deregister; errors are retried at the next beat."""
        while not self.stop.wait(self.interval_s):
            self.beat()
        self._deregister()

    def start(self) -> threading.Thread:
        """Register now (in the caller's thread), then run :meth:`run` in a daemon thread (once)."""
        if self.thread is None:
            self.beat()
            self.thread = threading.Thread(target=self.run, name="halfcast-heartbeat", daemon=True)
            self.thread.start()
        return self.thread

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the thread (stopped by ``stop``) to deregister and end."""
        if self.thread is not None:
            self.thread.join(timeout_s)
            return not self.thread.is_alive()
        return True

    def _deregister(self) -> None:
        try:
            self.roster.deregister()
            log.info("worker roster: %s deregistered", self.roster.info.id)
        except Exception:
            log.exception("worker roster: could not deregister %s", self.roster.info.id)
