"""How the API hands a committed job to the workers: one broker message carrying the job id."""

from __future__ import annotations

import logging
from typing import Protocol

from halfcast.core.broker.celery_app import RUN_JOB_TASK, create_celery_app
from halfcast.core.settings import Settings

log = logging.getLogger(__name__)

#: Publishing retries before ``enqueue`` gives up (about 1.5 s in all with a broker down).
PUBLISH_RETRY_POLICY = {"max_retries": 3, "interval_start": 0.0, "interval_step": 0.5, "interval_max": 0.5}


class JobQueue(Protocol):
    """Sends a job id to the workers. ``enqueue`` raises if the message could not be sent."""

    def enqueue(self, job_id: str) -> None:
        """Publish one message for ``job_id``; raise on failure."""
        ...


class CeleryJobQueue:
    """A :class:`JobQueue` publishing ``halfcast.run_job`` by name, so the API never imports worker tasks."""

    def __init__(self, settings: Settings) -> None:
        self._app = create_celery_app(settings)
        self._queue_name = settings.queue_name

    def enqueue(self, job_id: str) -> None:
        """Publish ``RUN_JOB_TASK(job_id)`` to the configured queue.

        Raises the broker's connection error (e.g. ``kombu.exceptions.OperationalError``)
        once the publish retries are spent.
        """
        self._app.send_task(
            RUN_JOB_TASK,
            args=[job_id],
            queue=self._queue_name,
            retry=True,
            retry_policy=PUBLISH_RETRY_POLICY,
        )
        log.info("enqueued job %s on queue %s", job_id, self._queue_name)

    def close(self) -> None:
        """Release the broker connections of the underlying Celery app."""
        self._app.close()
