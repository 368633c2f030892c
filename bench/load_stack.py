"""The stack the API load bench runs against: a scratch PostgreSQL database and a real ``halfcast api``.

:func:`scratch_database` creates a database of its own on the server of an admin URL
and drops it afterwards (``WITH (FORCE)``, so a leftover connection cannot keep it).
:class:`ApiProcess` runs ``python -m halfcast.cli api`` (what the ``halfcast api``
entry point runs) as a subprocess on that database, with a data directory of its own
(embedded filesystem broker), waits for ``/healthz`` and stops it with SIGTERM.
:func:`admin_token` makes a token straight in the database, as ``halfcast tokens create`` does.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx
from sqlalchemy import create_engine, text

from halfcast.core.db.engine import make_engine, make_session_factory
from halfcast.core.db.migrate import upgrade_database
from halfcast.core.db.tokens import create_token

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
#: Seconds the API gets to answer ``/healthz`` after its start.
START_TIMEOUT_S = 60.0
#: Seconds the API gets to stop after SIGTERM before it is killed.
STOP_TIMEOUT_S = 20.0


@contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    """URL of a new, migrated database on the server of ``admin_url``; dropped on exit."""
    name = f"halfcast_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = f"{admin_url.rsplit('/', 1)[0]}/{name}"
    log.info("scratch database %s created", name)
    try:
        upgrade_database(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        log.info("scratch database %s dropped", name)


def admin_token(database_url: str, owner: str = "bench") -> str:
    """A new admin token of ``owner`` in the database at ``database_url``; its secret."""
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as session:
            return create_token(session, owner, admin=True, actor="cli:bench", via="cli").secret
    finally:
        engine.dispose()


#: The ports a bench's servers take: below the kernel's ephemeral range (32768-60999 by default), where
#: outgoing connections take their local ports, so no client connection takes one between the check and
#: the server's own bind ("address already in use", seen when the suite runs the benches beside others).
BENCH_PORTS = range(10000, 20000)


def free_port() -> int:
    """A loopback TCP port nobody listens on right now, drawn from :data:`BENCH_PORTS`."""
    for port in random.sample(BENCH_PORTS, 100):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {BENCH_PORTS.start}-{BENCH_PORTS.stop - 1}")


class ApiProcess:
    """``with ApiProcess(database_url, data_dir) as api:`` serves the API at ``api.url`` until the block ends.

    ``workers`` > 1 passes ``--workers`` (several uvicorn processes); ``env`` adds
    ``HALFCAST_*`` settings; ``root`` is the source tree the API runs from (default:
    this one; another checkout measures an older version). The API's output goes to
    ``<data_dir>/api.log``.
    """

    def __init__(
        self,
        database_url: str,
        data_dir: Path,
        *,
        workers: int = 1,
        env: Mapping[str, str] | None = None,
        root: Path = ROOT,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        self.log_path = data_dir / "api.log"
        self.command = [
            sys.executable,
            "-m",
            "halfcast.cli",
            "--log-level",
            "WARNING",
            "api",
            "--port",
            str(self.port),
            "--data-dir",
            str(data_dir),
        ]
        if workers > 1:
            self.command += ["--workers", str(workers)]
        self.root = root
        self.env = process_environment(database_url, env or {}, root)
        self.popen: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.popen = subprocess.Popen(
                self.command, env=self.env, cwd=self.root, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        log.info("API up at %s (pid %d): %s", self.url, self.popen.pid, " ".join(self.command[1:]))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.popen is not None and self.popen.poll() is not None:
                raise RuntimeError(f"the API exited at start:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the API did not answer within {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM the API (uvicorn stops its workers); SIGKILL it after :data:`STOP_TIMEOUT_S`."""
        stop_process(self.popen, "the API", STOP_TIMEOUT_S)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the API's output."""
        return log_tail(self.log_path, lines)


def stop_process(popen: subprocess.Popen[bytes] | None, what: str, timeout_s: float) -> None:
    """SIGTERM ``popen`` unless it has ended; SIGKILL it after ``timeout_s``."""
    if popen is None or popen.poll() is not None:
        return
    popen.send_signal(signal.SIGTERM)
    try:
        popen.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("%s did not stop within %.0f s; killing it", what, timeout_s)
        popen.kill()
        popen.wait()


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of the output file at ``path`` (empty if there is none yet)."""
    text_ = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text_.splitlines()[-lines:])


def process_environment(database_url: str, extra: Mapping[str, str], root: Path) -> dict[str, str]:
    """This process's environment without ``HALFCAST_*`` and with ``root`` first on the path, plus the database and ``extra``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HALFCAST_")}
    others = [part for part in env.get("PYTHONPATH", "").split(os.pathsep) if part and Path(part).resolve() != ROOT]
    env["PYTHONPATH"] = os.pathsep.join([str(root), *others])
    env["HALFCAST_DATABASE_URL"] = database_url
    env.update(extra)
    return env
