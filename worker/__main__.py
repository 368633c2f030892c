"""``python -m worker``: a Celery worker for the settings in the environment.

Runs the thread pool (the training runs in torchrun subprocesses, so threads only
supervise) on ``settings.queue_name`` with one thread per slot:
``settings.worker_concurrency`` CPU jobs plus one per GPU (:mod:`worker.resources.slots`). Extra command-line arguments
go to Celery after the defaults, so they override them (e.g. ``--hostname other@%h``). This process never
imports torch.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from halfcast.common.quiet_logs import quiet_third_party_logs
from halfcast.common.redact import install_log_redaction
from halfcast.core.broker.celery_app import create_celery_app
from halfcast.core.settings import Settings
from worker.tasks import register_tasks


def worker_argv(settings: Settings, extra: Sequence[str] = (), threads: int | None = None) -> list[str]:
    """The ``celery worker`` arguments for ``settings``, then ``extra``; ``threads`` defaults to the CPU concurrency."""
    return [
        "worker",
        "--pool", "threads",
        "--concurrency", str(threads or settings.worker_concurrency),
        "-Q", settings.queue_name,
        "--hostname", "halfcast@%h",
        "--loglevel", "INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        *extra,
    ]  # fmt: skip  # each celery flag beside its value


def main(argv: Sequence[str] | None = None) -> None:
    """Run the worker until it is stopped (SIGTERM or Ctrl-C: running jobs are stopped and ended)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_redaction()
    quiet_third_party_logs()
    settings = Settings()
    app = create_celery_app(settings)
    runtime = register_tasks(app).halfcast_runtime
    threads = runtime.slots().threads
    app.worker_main(worker_argv(settings, sys.argv[1:] if argv is None else argv, threads))


if __name__ == "__main__":
    main()
