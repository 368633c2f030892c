"""``python -m worker``: a Celery worker for the settings in the environment.

Runs the thread pool (the training runs in torchrun subprocesses, so threads only
supervise) with ``settings.worker_concurrency`` jobs at once on
``settings.queue_name``. Extra command-line arguments go to Celery after the
defaults, so they override them (e.g. ``--hostname other@%h``). This process never
imports torch.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from server.settings import Settings
from worker.celery_app import create_celery_app
from worker.tasks import register_tasks


def worker_argv(settings: Settings, extra: Sequence[str] = ()) -> list[str]:
    """The ``celery worker`` arguments for ``settings``, then ``extra``."""
    return [
        "worker",
        "--pool", "threads",
        "--concurrency", str(settings.worker_concurrency),
        "-Q", settings.queue_name,
        "--hostname", "halfcast@%h",
        "--loglevel", "INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        *extra,
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    """Run the worker until it is stopped (SIGTERM or Ctrl-C: running jobs are stopped and ended)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings()
    app = create_celery_app(settings)
    register_tasks(app)
    app.worker_main(worker_argv(settings, sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
