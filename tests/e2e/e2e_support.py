"""The real stack for end-to-end tests: uvicorn serving the API and ``python -m worker``, as subprocesses.

All processes get the same ``HALFCAST_*`` environment (data directory in tmp, a
unique queue name, optionally Postgres and Redis). The database is migrated first
with ``python -m halfcast.cli db upgrade``; then an admin token is made with
``halfcast tokens create`` (:attr:`Stack.token`): the stack's client sends it, and
``HALFCAST_TOKEN`` in the stack's environment hands it to CLI subprocesses (a stack
started with ``auth="off"`` has none). A stack may run several workers
(``worker``, ``worker-2``, ...; each with its own ``--hostname``), which tests can
kill with SIGKILL and start again. On teardown everything is stopped with SIGTERM;
the logs are attached to the test log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from parallel_support import free_port

log = logging.getLogger("e2e")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TERMINAL = {"succeeded", "failed", "cancelled"}
#: Seconds to wait for the API to answer after start.
START_TIMEOUT_S = 90.0


def load_example(name: str, **overrides: Any) -> dict[str, Any]:
    """An example spec from ``examples/`` with top-level fields replaced."""
    spec = json.loads((EXAMPLES / name).read_text())
    spec.update(overrides)
    return spec


def stack_environment(data_dir: Path, **settings: str) -> dict[str, str]:
    """The environment of every stack process: this one's without HALFCAST_*, plus ``settings``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HALFCAST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    env["HALFCAST_DATA_DIR"] = str(data_dir)
    env["HALFCAST_QUEUE_NAME"] = f"e2e-{uuid.uuid4().hex[:8]}"
    env["HALFCAST_ALLOW_FAULTS"] = "1"
    env["HALFCAST_WORKER_POLL_INTERVAL_S"] = "0.1"
    env["HALFCAST_CANCEL_GRACE_S"] = "5"
    env.update({f"HALFCAST_{key.upper()}": value for key, value in settings.items()})
    return env


@dataclass
class Stack:
    """A running API and worker, and an HTTP client for the API."""

    data_dir: Path
    env: dict[str, str]
    workers: int = 1
    port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    client: httpx.Client = field(init=False)
    token: str | None = None
    _ready_marks: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.env["HALFCAST_PORT"] = str(self.port)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)

    def start(self) -> Stack:
        """Migrate the database, start the worker and the API, wait until the API answers."""
        subprocess.run(
            [sys.executable, "-m", "halfcast.cli", "db", "upgrade"],
            env=self.env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=120,
        )
        if self.env.get("HALFCAST_AUTH", "on").lower() not in ("off", "0", "false", "no"):
            self._make_token()
        for name in self.worker_names:
            self._spawn_worker(name)
        api = [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "server.app:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        self._spawn("api", api)
        self._wait_ready()
        return self

    def _cli_token(self, owner: str, *, admin: bool = False) -> str:
        """A new token of ``owner`` made with ``halfcast tokens create``; its secret."""
        made = subprocess.run(
            [
                sys.executable,
                "-m",
                "halfcast.cli",
                "tokens",
                "create",
                "--owner",
                owner,
                *(["--admin"] if admin else []),
            ],
            env=self.env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return made.stdout.strip()

    def _make_token(self) -> None:
        """Create an admin token; the client sends it and CLI subprocesses get it as ``HALFCAST_TOKEN``."""
        self.token = self._cli_token("e2e", admin=True)
        self.env["HALFCAST_TOKEN"] = self.token
        self.client.headers["Authorization"] = f"Bearer {self.token}"

    def client_for(self, owner: str) -> httpx.Client:
        """A new HTTP client of the API with a plain (not admin) token of ``owner``; the caller closes it."""
        headers = {"Authorization": f"Bearer {self._cli_token(owner)}"}
        return httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30, headers=headers)

    @property
    def worker_names(self) -> list[str]:
        """``worker``, then ``worker-2``, ``worker-3``, ..."""
        return ["worker"] + [f"worker-{n}" for n in range(2, self.workers + 1)]

    def _spawn(self, name: str, command: list[str]) -> None:
        log_file = (self.data_dir / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            command, env=self.env, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT
        )

    def _spawn_worker(self, name: str) -> None:
        self._ready_marks[name] = self._log_text(name).count(" ready.")
        self._spawn(name, [sys.executable, "-m", "worker", "--hostname", f"{name}@%h"])

    def _wait_ready(self, names: list[str] | None = None) -> None:
        names = names or list(self.processes)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for name in names:
                if self.processes[name].poll() is not None:
                    raise RuntimeError(f"{name} exited at start:\n{self.log_tail(name)}")
            try:
                api_up = "api" not in names or self.client.get("/healthz").status_code == 200
                if api_up and all(self._worker_ready(name) for name in names if name.startswith("worker")):
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the stack did not start:\n{self.log_tail('api')}\n{self.log_tail('worker')}")

    def _worker_ready(self, name: str = "worker") -> bool:
        return self._log_text(name).count(" ready.") > self._ready_marks.get(name, 0)

    def _log_text(self, name: str) -> str:
        path = self.data_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill_worker(self, name: str) -> None:
        """SIGKILL a worker process (no shutdown handlers run; its runs get their death signal)."""
        process = self.processes[name]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)

    def restart_worker(self, name: str) -> None:
        """Start a worker again (after :meth:`kill_worker`) and wait until it is ready."""
        assert self.processes[name].poll() is not None, f"{name} is still running"
        self._spawn_worker(name)
        self._wait_ready([name])

    def worker_of(self, worker_id: str) -> str:
        """The stack name of the worker whose lease owner id (``<hostname>/<pid>``) is ``worker_id``."""
        pid = int(worker_id.rsplit("/", 1)[1])
        return next(name for name, process in self.processes.items() if process.pid == pid)

    def log_tail(self, name: str, lines: int = 60) -> str:
        """The last lines of a process's log."""
        path = self.data_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM both processes; SIGKILL what does not stop within a minute."""
        self.client.close()
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for name, process in self.processes.items():
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                log.error("%s did not stop; killing it", name)
                process.kill()
                process.wait()
        for pid, _ in run_processes(str(self.data_dir)):  # a failing test must not leak its runs
            log.error("process %d of a run outlived the stack; killing it", pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    # ------------------------------------------------------------------ API helpers

    def submit(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """POST a spec; assert 201; return the job resource."""
        response = self.client.post("/jobs", json=dict(spec))
        assert response.status_code == 201, response.text
        return response.json()

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.client.get(f"/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def wait(
        self, job_id: str, until: Callable[[dict[str, Any]], bool], timeout_s: float = 300, poll_s: float = 0.1
    ) -> dict[str, Any]:
        """Poll ``GET /jobs/{id}`` until ``until(job)``; fail with the logs after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not until(job := self.job(job_id)):
            if time.monotonic() > deadline:
                pytest.fail(f"job {job_id} stuck at {job['status']}:\n{self.log_tail('worker')}")
            time.sleep(poll_s)
        return job

    def wait_terminal(self, job_id: str, timeout_s: float = 300) -> dict[str, Any]:
        return self.wait(job_id, lambda job: job["status"] in TERMINAL, timeout_s)

    def metric_points(self, job_id: str, limit: int = 64) -> list[dict[str, Any]]:
        """Every step record of the job, paging with ``after_step`` and ``limit``."""
        points: list[dict[str, Any]] = []
        after = 0
        while True:
            response = self.client.get(f"/jobs/{job_id}/metrics", params={"after_step": after, "limit": limit})
            assert response.status_code == 200, response.text
            page = response.json()
            assert page["job_id"] == job_id
            if not page["points"]:
                return points
            assert len(page["points"]) <= limit
            points.extend(page["points"])
            after = page["points"][-1]["step"]


def live_processes() -> Iterator[tuple[int, list[str], bytes]]:
    """``(pid, fields of /proc/<pid>/stat after the command name, command line)`` of live processes.

    The fields start at the state: ``[0]`` state, ``[1]`` parent pid, ``[3]`` session id.
    """
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if stat[0] not in ("Z", "X"):
            yield int(proc.name), stat, cmdline


def run_processes(job_id: str) -> list[tuple[int, int]]:
    """``(pid, session id)`` of every live process whose command line names ``job_id`` (any text)."""
    return [(pid, int(stat[3])) for pid, stat, cmdline in live_processes() if job_id.encode() in cmdline]


def session_alive(sid: int) -> list[int]:
    """Live processes of session ``sid``."""
    return [pid for pid, stat, _ in live_processes() if int(stat[3]) == sid]


def children(pid: int) -> list[int]:
    """Live child processes of ``pid``."""
    return [child for child, stat, _ in live_processes() if int(stat[1]) == pid]
