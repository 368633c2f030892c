"""``halfcast worker``: a Celery worker in the CLI's own process (registered by :mod:`halfcast.cli`).

``--data-dir`` sets ``HALFCAST_DATA_DIR`` as ``halfcast up`` and ``halfcast api`` do; every
other argument goes to ``celery worker`` (:func:`worker.__main__.worker_argv`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from halfcast.core.settings import settings_with_overrides


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``worker``."""
    worker = subparsers.add_parser("worker", help="run a Celery worker; extra arguments go to Celery")
    worker.add_argument("--data-dir", type=Path, help="data directory (HALFCAST_DATA_DIR)")
    worker.add_argument("celery_args", nargs=argparse.REMAINDER, help="arguments passed on to `celery worker`")
    worker.set_defaults(handler=run_worker)


def run_worker(args: argparse.Namespace) -> int:
    """Run a Celery worker in this process (as ``python -m worker`` does)."""
    from worker.__main__ import main as worker_main  # Celery and the worker's modules: only when it runs

    data_dir = args.data_dir and Path(args.data_dir).expanduser().resolve()
    settings_with_overrides({"HALFCAST_DATA_DIR": data_dir})
    worker_main([arg for arg in args.celery_args if arg != "--"])
    return 0
