"""Service commands: ``halfcast up`` (API + worker together) and ``halfcast api`` (``halfcast worker``: :mod:`worker.cli`).

Settings come from ``HALFCAST_*`` environment variables; ``--host``, ``--port``,
``--data-dir`` and ``--workers`` override them by setting those variables, so every
process of the stack sees the same settings. ``--workers N`` (``HALFCAST_API_WORKERS``)
serves the API from N uvicorn worker processes sharing the port. ``up`` and ``api`` refuse to start (exit 2) with
authentication off (``HALFCAST_AUTH=off``) on a non-loopback address. On its first
start ``up`` creates an admin token, prints it once and saves it to
``<data_dir>/token`` (:mod:`server.cli.bootstrap`). Once the API answers, ``up`` prints
its URL and the ``export HALFCAST_URL=...`` line for the CLI (:mod:`server.cli.ready`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from pathlib import Path

from halfcast.core.settings import Settings, settings_with_overrides
from server.cli.ready import announce_when_ready, client_url
from server.cli.supervisor import Child, RestartPolicy, Supervisor

log = logging.getLogger(__name__)

#: Seconds the API gets to finish its requests when stopped.
API_GRACE_S = 10.0
#: Seconds the worker gets beyond the cancel grace period to stop its runs and record them.
WORKER_EXTRA_GRACE_S = 30.0
#: Exit status when the settings forbid starting (authentication off on an open address).
EXIT_REFUSED = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``up`` and ``api``."""
    up = subparsers.add_parser("up", help="migrate, then run the API and a worker (embedded defaults)")
    _add_server_options(up)
    up.set_defaults(handler=run_up)
    api = subparsers.add_parser("api", help="run the HTTP API (uvicorn)")
    _add_server_options(api)
    api.set_defaults(handler=run_api)


def _add_server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="address to listen on (HALFCAST_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (HALFCAST_PORT, default 8000)")
    parser.add_argument("--data-dir", type=Path, help="data directory (HALFCAST_DATA_DIR, default .halfcast)")
    parser.add_argument("--workers", type=_positive, help="API processes (HALFCAST_API_WORKERS, default 1)")


def _positive(text: str) -> int:
    """An integer of at least 1 (argparse type)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _refused(settings: Settings) -> bool:
    """Write why and return ``True`` when authentication is off on a non-loopback address."""
    from server.auth import ExposureError, check_exposure  # the web framework: not for `halfcast worker`

    try:
        check_exposure(settings)
    except ExposureError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return True
    return False


def _announce_token(settings: Settings) -> None:
    """Create the first admin token if there is none yet, and say where the token is."""
    from halfcast.cli.credentials import token_path
    from server.cli.bootstrap import ensure_first_token

    if not settings.auth:
        sys.stdout.write("Authentication is OFF (HALFCAST_AUTH=off): anyone on this machine can use the API\n")
        return
    secret = ensure_first_token(settings)
    if secret is not None:
        sys.stdout.write(f"Admin API token (shown once; saved to {token_path(settings)}, mode 0600):\n  {secret}\n")
    elif token_path(settings).exists():
        sys.stdout.write(f"API token: {token_path(settings)}\n")


def apply_overrides(args: argparse.Namespace) -> Settings:
    """Write the command-line overrides into ``HALFCAST_*`` variables; return the resulting settings."""
    data_dir = getattr(args, "data_dir", None)
    return settings_with_overrides(
        {
            "HALFCAST_HOST": getattr(args, "host", None),
            "HALFCAST_PORT": getattr(args, "port", None),
            "HALFCAST_DATA_DIR": data_dir and Path(data_dir).expanduser().resolve(),
            "HALFCAST_API_WORKERS": getattr(args, "workers", None),
        }
    )


def child_environment() -> dict[str, str]:
    """This process's environment, with the project on ``PYTHONPATH`` for ``python -m``."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    parts = [part for part in env.get("PYTHONPATH", "").split(os.pathsep) if part]
    env["PYTHONPATH"] = os.pathsep.join([root, *[part for part in parts if part != root]])
    return env


def uvicorn_log_level(level: str) -> str:
    """uvicorn's name for the CLI's ``--log-level`` (``WARNING`` -> ``warning``).

    uvicorn configures its own loggers (``uvicorn.error``, and ``uvicorn.access`` with its
    line per request) at this level; without it they log at INFO whatever ``--log-level`` says.
    """
    return level.lower()


def api_command(settings: Settings, log_level: str = "INFO") -> list[str]:
    """The uvicorn command serving the API factory on the configured host and port, with ``api_workers`` processes.

    ``log_level`` is the CLI's ``--log-level``: uvicorn logs (its access line per request
    included) at that level.
    """
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "server.app:create_app",
        "--log-level",
        uvicorn_log_level(log_level),
        "--host",
        settings.host,
        "--port",
        str(settings.port),
    ]
    if settings.api_workers > 1:
        command += ["--workers", str(settings.api_workers)]
    return command


def run_up(args: argparse.Namespace) -> int:
    """Migrate the database, then run the API and a worker until Ctrl-C or SIGTERM."""
    from halfcast.core.db.migrate import upgrade_database

    settings = apply_overrides(args)
    if _refused(settings):
        return EXIT_REFUSED
    settings.resolved_data_dir.mkdir(parents=True, exist_ok=True)
    upgrade_database(settings.effective_database_url)
    _announce_token(settings)
    children = [
        Child("api", api_command(settings, getattr(args, "log_level", "INFO")), grace_s=API_GRACE_S),
        Child(
            "worker",
            [sys.executable, "-m", "worker"],
            grace_s=settings.cancel_grace_s + WORKER_EXTRA_GRACE_S,
            restart=RestartPolicy(),
        ),  # a dead worker is started again; its jobs are recovered by the reaper
    ]
    url = client_url(settings.host, settings.port)
    log.info("Halfcast is starting at %s (data in %s); Ctrl-C stops it", url, settings.resolved_data_dir)
    stopped = threading.Event()
    announce_when_ready(url, settings.resolved_data_dir, stopped)
    try:
        return Supervisor(children).run(child_environment())
    finally:
        stopped.set()


def run_api(args: argparse.Namespace) -> int:
    """Serve the API in this process."""
    import uvicorn

    from server.http.coalesced_writes import CoalescedHttpToolsProtocol

    settings = apply_overrides(args)
    if _refused(settings):
        return EXIT_REFUSED
    uvicorn.run(
        "server.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.api_workers,
        log_level=uvicorn_log_level(getattr(args, "log_level", "INFO")),
        http=CoalescedHttpToolsProtocol,  # an answer's head and body in one write (server/http/coalesced_writes.py)
    )
    return 0
