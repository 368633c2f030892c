"""The embedded stack (SQLite + filesystem broker, one worker of concurrency 2): field case C25, and a
worker killed with SIGKILL and started again recovers its own job."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import Stack, live_processes, load_example, run_processes

from conftest import make_stack

pytestmark = pytest.mark.e2e

log = logging.getLogger("e2e.recovery")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from make_stack(
        tmp_path_factory.mktemp("embedded-recovery"), worker_concurrency="2", lease_ttl_s="3", reaper_interval_s="1"
    )


def _spec(**overrides: Any) -> dict[str, Any]:
    return load_example("synthetic-fp16.json", **overrides)


def _master_ports(job_id: str) -> set[str]:
    """``MASTER_PORT`` of every live rank of the job: in its environment (torchrun sets it for its ranks), or in
    the process title of a warm run's launcher and ranks (worker/warm/agent.py)."""
    ports = set()
    for pid, _, cmdline in live_processes():
        if job_id.encode() not in cmdline:
            continue
        if titled := re.search(rb"MASTER_PORT=(\d+)", cmdline):
            ports.add(titled.group(1).decode())
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ports |= {entry.split(b"=", 1)[1].decode() for entry in environ if entry.startswith(b"MASTER_PORT=")}
    return ports


def test_two_multi_rank_jobs_started_together_both_succeed(stack: Stack) -> None:
    """C25 (pytorch#126510): two 2-rank CPU jobs submitted at the same moment on one worker host."""
    spec = _spec(processes=2, max_steps=40, faults={"sleep_per_step_s": 0.1})
    jobs: list[dict[str, Any]] = []
    barrier = threading.Barrier(2)

    def submit() -> None:
        barrier.wait()
        jobs.append(stack.submit(spec))

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    ids = [job["id"] for job in jobs]
    ports: dict[str, set[str]] = {job_id: set() for job_id in ids}
    deadline = time.monotonic() + 180
    while not all(ports.values()) and time.monotonic() < deadline:  # both run at once: read their endpoints
        for job_id in ids:
            ports[job_id] |= _master_ports(job_id)
        time.sleep(0.1)
    finished = [stack.wait_terminal(job_id, timeout_s=240) for job_id in ids]
    assert [job["status"] for job in finished] == ["succeeded", "succeeded"], [job["error"] for job in finished]
    assert all(len(p) == 1 for p in ports.values()), ports  # each job found its rendezvous port
    assert ports[ids[0]] != ports[ids[1]], ports  # and they differ
    logs = [path for job_id in ids for path in (stack.data_dir / "runs" / job_id / "attempt-1" / "logs").glob("*.log")]
    assert len(logs) == 6, logs  # launcher.log and rank-0.log, rank-1.log of each job
    texts = [path.read_text() for path in logs]
    texts.append(stack.log_tail("worker", 100_000))
    assert not any(re.search(r"address already in use|EADDRINUSE", text, re.IGNORECASE) for text in texts)
    first, second = (job["attempts"][0] for job in finished)
    assert first["started_at"] < second["ended_at"] and second["started_at"] < first["ended_at"]  # they overlapped


def test_a_killed_and_restarted_worker_recovers_its_job(stack: Stack) -> None:
    """kill -9 the only worker mid-job, start it again: its reaper requeues the job, which resumes."""
    job_id = stack.submit(_spec(max_steps=100, checkpoint_interval=5, faults={"sleep_per_step_s": 0.2}))["id"]
    stack.wait(job_id, lambda j: j["status"] == "running" and j["step"] >= 10, timeout_s=180)
    killed_at = time.monotonic()
    stack.kill_worker("worker")
    deadline = time.monotonic() + 10  # an orphaned run would need 18 s more to finish
    while run_processes(f"{job_id}/attempt-1"):
        assert time.monotonic() < deadline, "attempt 1 outlived its worker"
        time.sleep(0.1)
    assert stack.job(job_id)["status"] == "running"  # nobody recovers it while no worker runs
    stack.restart_worker("worker")
    job = stack.wait_terminal(job_id, timeout_s=240)
    seconds = time.monotonic() - killed_at
    log.warning(
        "fault matrix: %s",
        json.dumps(
            {
                "fault": "kill -9 + restart, embedded",
                "status": job["status"],
                "attempts": len(job["attempts"]),
                "seconds_to_terminal": round(seconds, 1),
                "processes_left": len(run_processes(job_id)),
            }
        ),
    )
    assert job["status"] == "succeeded", job["error"]
    assert [(a["attempt"], a["status"], a["reason"]) for a in job["attempts"]] == [
        (1, "failed", "worker_lost"),
        (2, "succeeded", None),
    ]
    assert [p["step"] for p in stack.metric_points(job_id)] == list(range(1, 101))
