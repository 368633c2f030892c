"""``halfcast up``: one command runs the migrated embedded stack and stops it cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2e_support import ROOT, children, free_port, load_example, run_processes, stack_environment

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def no_stray_runs(tmp_path: Path) -> Iterator[None]:
    """SIGKILL anything of the test's runs left behind, so a failing test leaks nothing."""
    yield
    for pid, _ in run_processes(str(tmp_path)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _start_up(data_dir: Path, port: int) -> tuple[subprocess.Popen[bytes], httpx.Client]:
    env = stack_environment(data_dir)
    log = (data_dir.parent / "up.log").open("ab")
    command = [sys.executable, "-m", "halfcast.cli", "up", "--port", str(port), "--data-dir", str(data_dir)]
    up = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert up.poll() is None, (data_dir.parent / "up.log").read_text()
        try:
            if client.get("/readyz").status_code == 200 and len(children(up.pid)) == 2:
                # the first start made an admin token and saved it where the CLI looks
                client.headers["Authorization"] = f"Bearer {(data_dir / 'token').read_text().strip()}"
                return up, client
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError((data_dir.parent / "up.log").read_text())


def _status(data_dir: Path, job_id: str) -> tuple[str, str | None]:
    with sqlite3.connect(data_dir / "halfcast.db") as conn:
        return conn.execute("SELECT status, error_reason FROM jobs WHERE id = ?", (job_id,)).fetchone()


def _wait_job(client: httpx.Client, job_id: str, until, timeout_s: float = 180) -> dict:
    deadline = time.monotonic() + timeout_s
    while not until(job := client.get(f"/jobs/{job_id}").json()):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


def test_up_runs_jobs_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    up, client = _start_up(data_dir, port)
    kids = children(up.pid)
    token = (data_dir / "token").read_text().strip()
    assert (data_dir.parent / "up.log").read_text().count(token) == 1  # printed once, on the first start
    assert (data_dir / "token").stat().st_mode & 0o777 == 0o600
    assert httpx.get(str(client.base_url).rstrip("/") + "/jobs").status_code == 401  # no token, no jobs
    done = client.post("/jobs", json=load_example("synthetic-fp16.json", max_steps=10)).json()
    assert _wait_job(client, done["id"], lambda j: j["status"] == "succeeded")["step"] == 10
    long = load_example("synthetic-fp16.json", max_steps=100_000, faults={"sleep_per_step_s": 0.2})
    assert long.get("max_attempts") is None
    running = client.post("/jobs", json=long).json()
    _wait_job(client, running["id"], lambda j: j["status"] == "running")
    assert run_processes(running["id"])
    client.close()
    up.send_signal(signal.SIGTERM)
    assert up.wait(timeout=60) == 0
    assert len(kids) == 2 and not any(Path(f"/proc/{pid}").exists() for pid in kids)
    assert run_processes(running["id"]) == []
    # never left running: requeued (worker_shutdown, not counted against max_attempts) to resume on the next start
    assert _status(data_dir, running["id"]) == ("queued", None)
    assert _status(data_dir, done["id"]) == ("succeeded", None)
    # once ready, it said where the API is, for the port it was given
    assert f"\n  export HALFCAST_URL=http://127.0.0.1:{port}\n" in (data_dir.parent / "up.log").read_text()


def _worker_pid(up: subprocess.Popen[bytes]) -> int | None:
    """The pid of the worker child of ``halfcast up`` (the child that is not uvicorn), if one runs."""
    pids = [pid for pid in children(up.pid) if b"uvicorn" not in Path(f"/proc/{pid}/cmdline").read_bytes()]
    return pids[0] if pids else None


def test_up_starts_the_worker_again_when_it_dies_and_the_api_runs_on(tmp_path: Path) -> None:
    """A worker killed with SIGKILL is replaced (issue 11: the host is never left without a worker)."""
    up, client = _start_up(tmp_path / "data", free_port())
    dead = _worker_pid(up)
    assert dead is not None
    subprocess.run(["kill", "-KILL", str(dead)], check=True)
    deadline = time.monotonic() + 30
    while (worker := _worker_pid(up)) in (None, dead):
        assert time.monotonic() < deadline and up.poll() is None, (tmp_path / "up.log").read_text()
        time.sleep(0.2)
    job = client.post("/jobs", json=load_example("synthetic-fp16.json", max_steps=3)).json()
    assert _wait_job(client, job["id"], lambda j: j["status"] in ("succeeded", "failed"))["status"] == "succeeded"
    assert "worker exited with status -9; starting it again" in (tmp_path / "up.log").read_text()
    client.close()
    up.send_signal(signal.SIGTERM)
    assert up.wait(timeout=60) == 0
    assert not Path(f"/proc/{worker}").exists()
