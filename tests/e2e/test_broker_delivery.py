"""Delivery faults of a Redis-backed deployment (issue 11): a broker restart while workers hold
unacknowledged messages, a busy worker that must not hold queued jobs, and a worker killed while it
holds a job's message.

Each test runs the real stack (API, Celery workers, torchrun) on the shared PostgreSQL and a PRIVATE
Redis (:mod:`private_services`), since the shared one must never be restarted. Every test asserts
that each job ends terminal exactly once and that no process of a run is left, and logs its row of
the fault matrix (docs/faults.md).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import TERMINAL, Stack, load_example, run_processes
from private_services import PrivateRedis, private_redis_fixture  # noqa: F401 (the private_redis fixture)

from conftest import make_stack

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

log = logging.getLogger("e2e.delivery")

ROOT = Path(__file__).resolve().parents[2]
HOLDER = ROOT / "tests" / "worker" / "gpu_holder.py"


def _spec(steps: int, sleep_s: float = 0.0, **overrides: Any) -> dict[str, Any]:
    faults = {"sleep_per_step_s": sleep_s} if sleep_s else None
    return load_example("synthetic-fp16.json", max_steps=steps, faults=faults, **overrides)


def _received(stack: Stack, name: str) -> int:
    """How many job messages the worker ``name`` holds or has held: the task's log line once its hold is recorded.

    Not Celery's "received" line: a worker killed between receiving a message and recording its hold
    (a busy host, such as one whose warm standby is importing torch) leaves no hold to recover.
    """
    return stack.log_tail(name, 1_000_000).count(": message taken by ")


def _wait_received(stack: Stack, count: int, timeout_s: float = 30) -> list[str]:
    """Wait until the workers took ``count`` job messages in all; the workers that took one."""
    deadline = time.monotonic() + timeout_s
    while sum(_received(stack, name) for name in stack.worker_names) < count:
        assert time.monotonic() < deadline, "the workers did not take the messages"
        time.sleep(0.1)
    return [name for name in stack.worker_names if _received(stack, name)]


def _settle(stack: Stack, job_ids: list[str], timeout_s: float) -> list[dict[str, Any]]:
    """Each job once it is terminal, or as it is when ``timeout_s`` is up (never fails: the matrix counts it)."""
    deadline = time.monotonic() + timeout_s
    jobs = [stack.job(job_id) for job_id in job_ids]
    while any(job["status"] not in TERMINAL for job in jobs) and time.monotonic() < deadline:
        time.sleep(0.2)
        jobs = [stack.job(job["id"]) if job["status"] not in TERMINAL else job for job in jobs]
    return jobs


def _matrix(stack: Stack, fault: str, jobs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """Log (and return) one row of the fault matrix (docs/faults.md) for ``jobs``."""
    runs = {job["id"]: list((stack.data_dir / "runs" / job["id"]).glob("attempt-*")) for job in jobs}
    row = {
        "fault": fault,
        "jobs": len(jobs),
        "terminal_once": sum(job["status"] in TERMINAL and len(runs[job["id"]]) == 1 for job in jobs),
        "lost": sum(job["status"] == "queued" for job in jobs),  # never started: no worker will take it
        "duplicated": sum(len(runs[job["id"]]) > 1 for job in jobs),
        "stuck": sum(job["status"] not in TERMINAL for job in jobs),
        "processes_left": len(run_processes(str(stack.data_dir))),
        **extra,
    }
    log.warning("fault matrix: %s", json.dumps(row))
    return row


def _claimed_by(stack: Stack, job_id: str) -> str:
    job = stack.job(job_id)
    return stack.worker_of(job["attempts"][-1]["worker_id"])


@pytest.fixture()
def two_workers(tmp_path: Path, postgres_url: str, private_redis: PrivateRedis) -> Iterator[Stack]:
    """Two workers of one CPU slot each on PostgreSQL and the private Redis; a short reaper interval."""
    yield from make_stack(
        tmp_path,
        workers=2,
        database_url=postgres_url,
        broker_url=private_redis.url,
        worker_concurrency="1",
        reaper_interval_s="1",
        worker_heartbeat_s="1",
        worker_live_s="3",
    )


def test_a_busy_worker_reserves_no_queued_job(two_workers: Stack) -> None:
    """While one worker's only slot runs a long job, short jobs all go to the idle worker, at once.

    Before the fix the busy worker took a message as soon as its first job was claimed
    (the early ack gave Celery's prefetch credit back) and kept it in its pool's queue,
    so a short job waited behind the long one while the other worker sat idle.
    """
    stack = two_workers
    long_id = stack.submit(_spec(400, sleep_s=0.2))["id"]
    stack.wait(long_id, lambda j: j["status"] == "running", timeout_s=120)
    busy = _claimed_by(stack, long_id)
    started = time.monotonic()
    short_ids = [stack.submit(_spec(3))["id"] for _ in range(3)]
    jobs = _settle(stack, short_ids, timeout_s=45)  # three short jobs one after another on the idle worker
    waited = time.monotonic() - started
    on_busy = sum(bool(job["attempts"]) and _claimed_by(stack, job["id"]) == busy for job in jobs)
    stack.client.post(f"/jobs/{long_id}/cancel")
    assert stack.wait_terminal(long_id)["status"] == "cancelled"
    row = _matrix(
        stack,
        "3 short jobs while the other worker is busy",
        jobs,
        seconds_for_all=round(waited, 1),
        messages_reserved_by_busy_worker=_received(stack, busy) - 1,
        ran_on_busy_worker=on_busy,
    )
    assert [job["status"] for job in jobs] == ["succeeded"] * 3
    assert row["terminal_once"] == 3 and row["processes_left"] == 0
    assert row["messages_reserved_by_busy_worker"] == 0 and on_busy == 0


def _hold_gpu(stack: Stack) -> subprocess.Popen[str]:
    """A process that holds GPU 0's lock file, so a GPU job waits for its slot (holding its message)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen(
        [sys.executable, str(HOLDER), str(stack.data_dir / "gpu-locks"), "0", "1"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "0"
    return holder


def _release(holder: subprocess.Popen[str]) -> None:
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)


@pytest.fixture()
def gpu_workers(tmp_path: Path, postgres_url: str, private_redis: PrivateRedis) -> Iterator[Stack]:
    """Two workers each handing out (pretend) GPU 0 and waiting a minute for a slot, on the private Redis."""
    yield from make_stack(
        tmp_path,
        workers=2,
        database_url=postgres_url,
        broker_url=private_redis.url,
        worker_gpus="0",
        worker_concurrency="1",
        worker_slot_wait_s="60",
        reaper_interval_s="1",
        worker_heartbeat_s="1",
        worker_live_s="3",
    )


def test_a_worker_killed_while_holding_a_message_does_not_strand_its_job(gpu_workers: Stack) -> None:
    """A worker dies (SIGKILL) while it holds a queued job's message; a live worker runs the job soon after.

    The job waits for GPU 0 (held by another process), so its message sits unacknowledged
    with the worker that took it. Before the fix the job stayed ``queued`` until Redis's
    visibility timeout (an hour) although the other worker was free.
    """
    stack = gpu_workers
    holder = _hold_gpu(stack)
    try:
        job_id = stack.submit(_spec(1, gpus=1))["id"]
        holders = _wait_received(stack, 1)
        stack.kill_worker(holders[0])
        killed_at = time.monotonic()
    finally:
        _release(holder)
    job = _settle(stack, [job_id], timeout_s=60)[0]  # on this CPU host the trainer then finds no CUDA: failed
    claimed_s = round(time.monotonic() - killed_at, 1) if job["attempts"] else None
    row = _matrix(stack, "kill -9 of a worker holding a queued job's message", [job], seconds_to_terminal=claimed_s)
    assert row["terminal_once"] == 1 and row["lost"] == 0 and row["processes_left"] == 0
    assert stack.worker_of(job["attempts"][0]["worker_id"]) != holders[0]


def test_workers_ride_out_a_redis_restart_while_holding_messages(
    gpu_workers: Stack, private_redis: PrivateRedis
) -> None:
    """Redis restarts (losing everything) while both workers hold unacknowledged messages; both live on.

    Each worker holds one GPU job's message, waiting for the GPU another process holds.
    Before the fix kombu's restore of those messages after the lost connection raised
    ``AttributeError("'NoneType' object has no attribute 'hostname'")`` and Celery called
    it unrecoverable: every such worker exited. Now both reconnect, the lost messages are
    sent again from the database, and every job ends terminal once.
    """
    stack = gpu_workers
    holder = _hold_gpu(stack)
    try:
        ids = [stack.submit(_spec(1, gpus=1))["id"] for _ in range(2)]
        _wait_received(stack, len(ids))
        private_redis.stop()
        time.sleep(2)
        private_redis.start()
        restarted_at = time.monotonic()
        time.sleep(3)
    finally:
        _release(holder)
    jobs = _settle(stack, ids, timeout_s=90)
    alive = [name for name in stack.worker_names if stack.processes[name].poll() is None]
    after = _settle(stack, [stack.submit(_spec(3))["id"]], timeout_s=90) if alive else []  # still consuming?
    row = _matrix(
        stack,
        "Redis restart (no persistence) while 2 workers hold messages",
        jobs + after,
        workers_alive=f"{len(alive)} of {len(stack.worker_names)}",
        seconds_to_terminal=round(time.monotonic() - restarted_at, 1),
    )
    assert alive == stack.worker_names, [stack.log_tail(n) for n in stack.worker_names]
    for name in stack.worker_names:
        assert "Unrecoverable error" not in stack.log_tail(name, 1_000_000)
    assert row["terminal_once"] == 3 and row["stuck"] == 0 and row["processes_left"] == 0
    assert after[0]["status"] == "succeeded"
