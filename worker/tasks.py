"""Celery tasks of the worker. ``register_tasks(app)`` adds them to an app; nothing at import time.

``RUN_JOB_TASK`` is thin and idempotent: it hands the job id to
:func:`worker.runner.run_job`, which claims the job with a compare-and-set before
doing anything, so a redelivered or duplicate message is a logged no-op
(celery#5935); the message is acknowledged right after the claim
(:mod:`worker.acks`). If the database cannot be reached for the claim, the task is
retried later rather than dropped. The training itself runs in a torchrun
subprocess; this process never imports torch (celery#6036).

When the worker is ready it starts the reaper (:mod:`worker.reaper`); a warm
shutdown stops it and the running attempts.
"""

from __future__ import annotations

import logging
import os
import threading
from functools import partial
from typing import Any

from celery import Celery, Task
from celery.signals import worker_ready, worker_shutting_down
from sqlalchemy.exc import DBAPIError

from server.db.engine import make_engine
from server.settings import Settings
from worker.acks import acknowledge
from worker.celery_app import RUN_JOB_TASK
from worker.reaper import Reaper
from worker.recovery import Recovery
from worker.runner import RunnerContext, run_job
from worker.store import JobStore

log = logging.getLogger(__name__)

#: Seconds before a task whose claim met a database error runs again.
CLAIM_RETRY_S = 5.0


class WorkerRuntime:
    """Per-process state shared by the task's threads: settings, store, broker, shutdown flag, reaper."""

    def __init__(self, settings: Settings, app: Celery) -> None:
        self.settings = settings
        self.app = app
        self.shutdown = threading.Event()
        self._store: JobStore | None = None
        self._reaper: Reaper | None = None
        self._lock = threading.Lock()

    @property
    def store(self) -> JobStore:
        """The job store (the engine is created on first use, not at registration)."""
        with self._lock:
            if self._store is None:
                self._store = JobStore(make_engine(self.settings.effective_database_url))
            return self._store

    def enqueue(self, job_id: str) -> None:
        """Send ``RUN_JOB_TASK(job_id)`` to the queue (a retry after a lost worker)."""
        self.app.send_task(RUN_JOB_TASK, args=[job_id], queue=self.settings.queue_name)

    def worker_id(self, hostname: str | None) -> str:
        """This worker's identity, the owner of its leases: ``<hostname>/<pid>``."""
        return f"{hostname or 'worker'}/{os.getpid()}"

    def context(self, hostname: str | None, task_id: str | None = None) -> RunnerContext:
        """A runner context for one task; its message is acknowledged once the job is claimed."""
        return RunnerContext(
            settings=self.settings,
            store=self.store,
            worker_id=self.worker_id(hostname),
            shutdown=self.shutdown,
            enqueue=self.enqueue,
            on_claimed=partial(acknowledge, task_id),
        )

    def reaper(self) -> Reaper:
        """The reaper of this worker (created once)."""
        store = self.store
        with self._lock:
            if self._reaper is None:
                self._reaper = Reaper(Recovery(store, self.enqueue), self.settings.reaper_interval_s, self.shutdown)
            return self._reaper

    def on_ready(self, **_: Any) -> None:
        """Celery ``worker_ready`` receiver: start the reaper (its first pass runs at once)."""
        log.info("starting the reaper (every %.1f s)", self.settings.reaper_interval_s)
        self.reaper().start()

    def on_shutdown(self, **_: Any) -> None:
        """Celery ``worker_shutting_down`` receiver: the reaper stops; running attempts stop their runs."""
        log.info("worker shutting down: stopping running jobs")
        self.shutdown.set()


def register_tasks(app: Celery) -> Task:
    """Register ``RUN_JOB_TASK`` on ``app`` (settings from ``app.conf.halfcast_settings``); return the task."""
    settings: Settings = app.conf.get("halfcast_settings") or Settings()
    runtime = WorkerRuntime(settings, app)
    worker_shutting_down.connect(runtime.on_shutdown, weak=False)
    worker_ready.connect(runtime.on_ready, weak=False)

    @app.task(name=RUN_JOB_TASK, bind=True, acks_late=True, ignore_result=True, max_retries=None)
    def run_job_task(self: Task, job_id: str) -> str | None:
        """Run one attempt of ``job_id`` (a no-op unless the job is ``queued``)."""
        try:
            outcome = run_job(str(job_id), runtime.context(self.request.hostname, self.request.id))
        except DBAPIError as exc:  # only the claim can raise: the attempt itself records its errors
            log.warning("job %s: database error before the claim; retrying in %.0f s: %s", job_id, CLAIM_RETRY_S, exc)
            raise self.retry(exc=exc, countdown=CLAIM_RETRY_S) from exc
        return outcome.status if outcome else None

    run_job_task.halfcast_runtime = runtime  # type: ignore[attr-defined]
    return run_job_task
