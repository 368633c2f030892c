"""Celery application factory. Nothing is created at import time.

Settings are chosen for long GPU jobs: late acks (a message is acknowledged only
when its task ends), prefetch of one, and rejection on worker loss. Exactly-once
launch does not rely on the broker: the task claims the job in the database with a
compare-and-set, so a redelivered message is a no-op.
"""

from __future__ import annotations

from celery import Celery

from server.settings import Settings
from worker.fs_transport import TRANSPORT_PATH as FILESYSTEM_TRANSPORT_PATH

#: Name of the task that runs one job; the API enqueues it by name.
RUN_JOB_TASK = "halfcast.run_job"


def broker_transport_options(settings: Settings) -> dict[str, object]:
    """Transport options: folders for the embedded ``filesystem://`` broker."""
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
    # Redis re-delivers unacknowledged messages after this many seconds; a job may
    # run for days, and the database claim drops any redelivery anyway.
    return {"visibility_timeout": 7 * 24 * 3600}


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
    if settings.effective_broker_url.startswith("filesystem://"):
        # kombu's own filesystem channel can lose messages (see worker.fs_transport)
        app.conf.broker_transport = FILESYSTEM_TRANSPORT_PATH
    app.conf.halfcast_settings = settings
    return app
