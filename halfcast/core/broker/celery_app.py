"""Celery application factory. Nothing is created at import time.

Settings are chosen for long GPU jobs (docs/worker.md, "Delivery"):

- late acks: a message is not acknowledged when it is received, so a worker that
  dies before it claims the job leaves the message to be delivered again; the task
  acknowledges it as soon as the job is claimed (:mod:`worker.messages.acks`), and from then
  on the database lease and the reaper look after the job, not the broker;
- no prefetch on Redis (``worker_disable_prefetch``): a worker takes a message only
  when one of its threads is free to run it. A prefetch count alone is not enough
  here: the early ack gives its credit back while the task still holds its thread,
  so a busy worker would reserve more messages and keep them in its pool's queue
  while other workers sit idle. The embedded broker serves one host, where a
  prefetch of one per thread is kept;
- the Redis transport of :mod:`halfcast.core.broker.redis_transport`, which survives a broker
  restart while messages are unacknowledged (kombu's own makes the worker exit);
- rejection on worker loss (with a process pool, a child killed mid-task gives the
  message back rather than acknowledging it);
- Redis's visibility timeout (``HALFCAST_BROKER_VISIBILITY_TIMEOUT_S``, default one
  hour): how long an unacknowledged message waits before it is delivered again.
  Since a message is acknowledged at the claim, only a worker that died between
  receiving and claiming waits this long, and a redelivery is dropped by the
  claim's compare-and-set anyway.
"""

from __future__ import annotations

from celery import Celery

from halfcast.core.broker.fs_transport import TRANSPORT_PATH as FILESYSTEM_TRANSPORT_PATH
from halfcast.core.broker.redis_transport import TRANSPORT_PATH as REDIS_TRANSPORT_PATH
from halfcast.core.settings import Settings

#: Name of the task that runs one job; the API enqueues it by name.
RUN_JOB_TASK = "halfcast.run_job"
#: Broker URL schemes served by :mod:`halfcast.core.broker.redis_transport`.
REDIS_TRANSPORT_SCHEMES = ("redis://", "rediss://")


def broker_transport_options(settings: Settings) -> dict[str, object]:
    """Transport options: folders for the embedded ``filesystem://`` broker; Redis's visibility timeout."""
    if settings.effective_broker_url.startswith("filesystem://"):
        folder = settings.broker_dir
        for sub in ("in", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        return {
            "data_folder_in": str(folder / "in"),
            "data_folder_out": str(folder / "in"),
            "processed_folder": str(folder / "processed"),
            # kombu's default is ./control, relative to whatever the current directory is
            "control_folder": str(folder / "control"),
            "store_processed": False,
            # seconds between looks at the folder (kombu's default is 1 s)
            "polling_interval": 0.2,
        }
    # Redis delivers an unacknowledged message again after this many seconds; the
    # message of a claimed job is already acknowledged, and a redelivery is dropped.
    # kombu looks for such messages only every interval x throttle seconds (100 s by
    # default), so the timeout would be that late: look every min(10, timeout / 2) s.
    visibility = settings.broker_visibility_timeout_s
    return {
        "visibility_timeout": visibility,
        "unacked_restore_interval": max(1.0, min(10.0, visibility / 2)),
        "unacked_restore_throttle": 1,
    }


def create_celery_app(settings: Settings | None = None) -> Celery:
    """Build the Celery app for ``settings`` (default: from the environment)."""
    settings = settings or Settings()
    app = Celery("halfcast", broker=settings.effective_broker_url)
    app.conf.update(
        broker_transport_options=broker_transport_options(settings),
        broker_connection_retry_on_startup=True,
        task_default_queue=settings.queue_name,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        task_serializer="json",
        accept_content=["json"],
        enable_utc=True,
    )
    url = settings.effective_broker_url
    if url.startswith("filesystem://"):
        # kombu's own filesystem channel can lose messages (see halfcast.core.broker.fs_transport)
        app.conf.broker_transport = FILESYSTEM_TRANSPORT_PATH
    elif url.startswith(REDIS_TRANSPORT_SCHEMES):
        app.conf.broker_transport = REDIS_TRANSPORT_PATH
        app.conf.worker_disable_prefetch = True
    app.conf.halfcast_settings = settings
    return app
