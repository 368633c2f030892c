"""Celery tasks of the worker. ``register_tasks(app)`` adds them to an app; nothing at import time.

``RUN_JOB_TASK`` is thin and idempotent: it hands the job id to
:func:`worker.runner.run_job`, which claims the job with a compare-and-set before
doing anything, so a redelivered or duplicate message is a logged no-op
(celery#5935). The training itself runs in a torchrun subprocess; this process
never imports torch (celery#6036).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import Celery, Task
from celery.signals import worker_shutting_down

from server.db.engine import make_engine
from server.settings import Settings
from worker.celery_app import RUN_JOB_TASK
from worker.runner import RunnerContext, run_job
from worker.store import JobStore

log = logging.getLogger(__name__)


class WorkerRuntime:
    """Per-process state shared by the task's threads: settings, a lazily built store, shutdown flag."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.shutdown = threading.Event()
        self._store: JobStore | None = None
        self._lock = threading.Lock()

    @property
    def store(self) -> JobStore:
        """The job store (the engine is created on first use, not at registration)."""
        with self._lock:
            if self._store is None:
                self._store = JobStore(make_engine(self.settings.effective_database_url))
            return self._store

    def context(self, hostname: str | None) -> RunnerContext:
        """A runner context naming this worker ``<hostname>/<pid>``."""
        worker_id = f"{hostname or 'worker'}/{os.getpid()}"
        return RunnerContext(settings=self.settings, store=self.store, worker_id=worker_id, shutdown=self.shutdown)

    def on_shutdown(self, **_: Any) -> None:
        """Celery ``worker_shutting_down`` receiver: running attempts stop their runs and end."""
        log.info("worker shutting down: stopping running jobs")
        self.shutdown.set()


def register_tasks(app: Celery) -> Task:
    """Register ``RUN_JOB_TASK`` on ``app`` (settings from ``app.conf.halfcast_settings``); return the task."""
    settings: Settings = app.conf.get("halfcast_settings") or Settings()
    runtime = WorkerRuntime(settings)
    worker_shutting_down.connect(runtime.on_shutdown, weak=False)

    @app.task(name=RUN_JOB_TASK, bind=True, acks_late=True, ignore_result=True)
    def run_job_task(self: Task, job_id: str) -> str | None:
        """Run one attempt of ``job_id`` (a no-op unless the job is ``queued``)."""
        outcome = run_job(str(job_id), runtime.context(self.request.hostname))
        return outcome.status if outcome else None

    run_job_task.halfcast_runtime = runtime  # type: ignore[attr-defined]
    return run_job_task
