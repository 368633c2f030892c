"""Private Redis and PostgreSQL servers for fault-injection tests that stop and start them.

The shared servers on this machine serve other people's tests, so tests that
restart a service get their own: a ``redis-server`` on a free port without
persistence, and a throw-away PostgreSQL cluster (``initdb`` into a temporary
directory owned by ``postgres``, trust authentication, TCP on 127.0.0.1 and a
socket in its own directory). PostgreSQL refuses to run as root, so its commands
run through ``runuser -u postgres`` when this process is root.

Each server has :meth:`stop`, :meth:`start` and :meth:`restart`; the fixtures
always stop them and delete their directories on teardown. When a binary is
missing the fixtures skip with the reason.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from e2e_support import free_port

log = logging.getLogger("e2e.services")

#: Where PostgreSQL's server binaries may be (first match wins), then ``PATH``.
POSTGRES_BIN_DIRS = ("/usr/lib/postgresql/15/bin", "/usr/local/bin")
#: The system user that owns and runs the private cluster when this process is root.
POSTGRES_USER = "postgres"
#: Seconds to wait for a server to accept connections after start.
START_TIMEOUT_S = 30.0


def wait_for_port(port: int, timeout_s: float = START_TIMEOUT_S, up: bool = True) -> None:
    """Wait until 127.0.0.1:``port`` accepts connections (``up``) or refuses them (not ``up``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                accepting = True
        except OSError:
            accepting = False
        if accepting == up:
            return
        time.sleep(0.05)
    raise TimeoutError(f"port {port} still {'closed' if up else 'open'} after {timeout_s} s")


@dataclass
class PrivateRedis:
    """A ``redis-server`` of this test module: no RDB snapshots, no AOF (a restart loses every key)."""

    directory: Path
    port: int = field(default_factory=free_port)
    binary: str = "redis-server"
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The broker URL of the server (logical database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        assert self.process is None or self.process.poll() is not None, "redis is already running"
        command = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.directory),
        ]
        log_file = (self.directory / "redis.log").open("ab")
        self.process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_port(self.port)
        log.info("private redis up on port %d (pid %d)", self.port, self.process.pid)

    def stop(self) -> None:
        """SIGTERM the server (SIGKILL after 10 s) and wait until the port is closed."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        wait_for_port(self.port, up=False)
        log.info("private redis on port %d stopped", self.port)

    def restart(self) -> None:
        """Stop, then start again on the same port (with nothing in it)."""
        self.stop()
        self.start()


def _as_postgres(command: list[str]) -> list[str]:
    """``command`` run as the ``postgres`` user when this process is root."""
    return ["runuser", "-u", POSTGRES_USER, "--", *command] if os.geteuid() == 0 else command


@dataclass
class PrivatePostgres:
    """A PostgreSQL cluster of this test module (trust auth, ``fsync`` off), controlled with ``pg_ctl``."""

    directory: Path
    bin_dir: Path
    port: int = field(default_factory=free_port)
    database: str = "halfcast"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the database ``database`` (created by :meth:`init`)."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *command: str, timeout_s: float = 120) -> None:
        subprocess.run(
            _as_postgres([str(self.bin_dir / command[0]), *command[1:]]),
            check=True,
            capture_output=True,
            timeout=timeout_s,
        )

    def init(self) -> None:
        """``initdb`` the cluster, start it and create the database."""
        self._run("initdb", "-D", str(self.data_dir), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", self.database)

    def start(self) -> None:
        """``pg_ctl start -w`` on this module's port and socket directory."""
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl", "-D", str(self.data_dir), "-o", options, "-l", str(self.directory / "postgres.log"), "-w", "start"
        )
        wait_for_port(self.port)
        log.info("private postgres up on port %d", self.port)

    def stop(self) -> None:
        """``pg_ctl stop -m fast`` (open connections are closed); a stopped cluster is left alone."""
        if not (self.data_dir / "postmaster.pid").exists():
            return
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")
        wait_for_port(self.port, up=False)
        log.info("private postgres on port %d stopped", self.port)

    def restart(self) -> None:
        """Stop, then start again on the same port."""
        self.stop()
        self.start()


def postgres_bin_dir() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``createdb``; ``None`` if there is none."""
    candidates = [Path(d) for d in POSTGRES_BIN_DIRS]
    if (found := shutil.which("pg_ctl")) is not None:
        candidates.append(Path(found).resolve().parent)
    for candidate in candidates:
        if all((candidate / name).exists() for name in ("initdb", "pg_ctl", "createdb")):
            return candidate
    return None


def _private_dir(prefix: str) -> Path:
    """A new directory under the system temp dir, owned by ``postgres`` when this process is root."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        account = pwd.getpwnam(POSTGRES_USER)
        os.chown(directory, account.pw_uid, account.pw_gid)
    return directory


def _skip_unless_postgres_can_run() -> Path:
    """The PostgreSQL binary directory, or skip (no binaries; root without a ``postgres`` user or ``runuser``)."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        pytest.skip(f"PostgreSQL server binaries (initdb, pg_ctl, createdb) not found in {POSTGRES_BIN_DIRS} or PATH")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(POSTGRES_USER)
        except KeyError:
            pytest.skip(f"running as root and there is no {POSTGRES_USER!r} user to run PostgreSQL as")
        if shutil.which("runuser") is None:
            pytest.skip("running as root and runuser is missing (PostgreSQL refuses to run as root)")
    return bin_dir


@pytest.fixture(scope="module", name="private_redis")
def private_redis_fixture() -> Iterator[PrivateRedis]:
    """A private Redis server for one test module; stopped on teardown."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server not found in PATH")
    server = PrivateRedis(Path(tempfile.mkdtemp(prefix="halfcast-redis-")), binary=binary)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.directory, ignore_errors=True)


@pytest.fixture(scope="module", name="private_postgres")
def private_postgres_fixture() -> Iterator[PrivatePostgres]:
    """A private PostgreSQL cluster with one empty database for one test module; stopped on teardown."""
    bin_dir = _skip_unless_postgres_can_run()
    server = PrivatePostgres(_private_dir("halfcast-pg-"), bin_dir)
    try:
        server.init()
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(server.directory, ignore_errors=True)
