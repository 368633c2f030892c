"""The two attacks of issue 24 that need workers, replayed by :mod:`bench.trust_attacks` on its stack.

- **Row lock** (item 5): two jobs run, each at its first step; another session locks both rows
  (``SELECT … FOR UPDATE``) for ``lock_s`` seconds, longer than the first job has left and than a
  lease lasts. Meanwhile the second job is cancelled: ``cancel_answer_s`` is how long
  ``POST /jobs/{id}/cancel`` took. Once the lock is released the first job must end ``succeeded``
  with no step trained twice (``rerun_steps``: step records, over all of its attempts' run
  directories, that repeat a step already trained) and the second ``cancelled``.
- **2-node job on workers of 2 slots** (item 6): a ``nodes: 2`` job is submitted while node 0's
  worker (2 slots) is alone, so its own second slot takes the join message; the second worker
  starts a few seconds later. ``two_node_status`` is how the job ended (``succeeded`` expected).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from bench.job_start import worker_process
from bench.load_stack import ROOT
from halfcast.core.db.engine import make_engine

log = logging.getLogger("bench.trust_workers")

#: Every worker of the replay: two slots (the default of ``halfcast up`` and ``halfcast worker``), fast polls.
WORKER_ENV = {
    "HALFCAST_WORKER_CONCURRENCY": "2",
    "HALFCAST_WORKER_HOST_ADDRESS": "127.0.0.1",
    "HALFCAST_WORKER_POLL_INTERVAL_S": "0.2",
    "HALFCAST_ALLOW_FAULTS": "1",
}
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
#: The 2-node job of item 6: one rank on each of two workers, short timeouts.
TWO_NODE_SPEC: dict[str, Any] = {
    "model": {"name": "mlp"},
    "dataset": {"name": "synthetic"},
    "max_steps": 4,
    "nodes": 2,
    "processes": 1,
    "distributed": {"timeout_s": 60, "gang_timeout_s": 120},
}
#: Seconds a job may take to end once nothing holds it back.
JOB_TIMEOUT_S = 300.0


@dataclass
class WorkerAttacks:
    """What the worker attacks left: ``rerun_steps`` 0, ``cancel_answer_s`` under 2, both statuses as expected."""

    rerun_steps: int = 0
    locked_job_status: str = ""
    #: The attempt that ended the locked job (2 when its lease ran out during the lock and attempt 2 recorded
    #: attempt 1's success instead of training again).
    locked_job_attempt: int = 0
    cancel_answer_s: float = 0.0
    cancelled_job_status: str = ""
    two_node_status: str = ""


def _wait(
    client: httpx.Client, job_id: str, until: Callable[[dict[str, Any]], bool], timeout_s: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while not until(job := client.get(f"/jobs/{job_id}").raise_for_status().json()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} stuck at {job['status']} (step {job.get('step')})")
        time.sleep(0.2)
    return job


def _wait_terminal(client: httpx.Client, job_id: str) -> dict[str, Any]:
    return _wait(client, job_id, lambda job: job["status"] in TERMINAL, JOB_TIMEOUT_S)


def _wait_workers(client: httpx.Client, count: int, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(client.get("/workers").raise_for_status().json()["workers"]) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {count} workers registered within {timeout_s:.0f} s")
        time.sleep(0.5)


def rerun_steps(run_dir: Path) -> int:
    """Step records in the attempts' ``records.jsonl`` under ``run_dir`` that repeat a step already trained."""
    counts: Counter[int] = Counter()
    for records in sorted(run_dir.glob("attempt-*/records.jsonl")):
        for line in records.read_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("type") == "step":
                    counts[int(record["step"])] += 1
    return sum(count - 1 for count in counts.values())


@contextlib.contextmanager
def locked_rows(database_url: str, job_ids: list[str]) -> Iterator[None]:
    """Hold ``SELECT … FOR UPDATE`` on the jobs' rows from another session for the duration of the block."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn, conn.begin():
            conn.execute(text("SET LOCAL idle_in_transaction_session_timeout = 0"))
            conn.execute(text("SELECT id FROM jobs WHERE id = ANY(:ids) FOR UPDATE"), {"ids": job_ids})
            yield
    finally:
        engine.dispose()


def row_lock(client: httpx.Client, database_url: str, data_dir: Path, report: WorkerAttacks, lock_s: float) -> None:
    """Lock two running jobs' rows for ``lock_s``; cancel one meanwhile; count the other's re-run steps."""
    base = {"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "checkpoint_interval": 20}
    finishing = {**base, "max_steps": 200, "faults": {"sleep_per_step_s": 0.1}}  # ~20 s, all inside the lock
    cancelled = {**base, "max_steps": 5000, "faults": {"sleep_per_step_s": 0.1}}
    ids = [client.post("/jobs", json=spec).raise_for_status().json()["id"] for spec in (finishing, cancelled)]
    for job_id in ids:
        _wait(client, job_id, lambda job: job["status"] == "running" and (job.get("step") or 0) >= 1, JOB_TIMEOUT_S)
    locked_at = time.monotonic()
    with locked_rows(database_url, ids):
        log.info("row lock: both rows locked for %.0f s", lock_s)
        started = time.monotonic()
        answer = client.post(f"/jobs/{ids[1]}/cancel")
        report.cancel_answer_s = round(time.monotonic() - started, 2)
        log.info("row lock: cancel answered %d in %.2f s", answer.status_code, report.cancel_answer_s)
        time.sleep(max(0.0, lock_s - (time.monotonic() - locked_at)))
    locked = _wait_terminal(client, ids[0])
    report.locked_job_status, report.locked_job_attempt = locked["status"], locked["attempt"]
    report.cancelled_job_status = _wait_terminal(client, ids[1])["status"]
    report.rerun_steps = rerun_steps(data_dir / "runs" / ids[0])


def two_node_job(client: httpx.Client, start_second_worker: Callable[[], None], report: WorkerAttacks) -> None:
    """Submit a 2-node job while node 0's worker is alone, start the second worker once it gathers, wait for it."""
    job_id = client.post("/jobs", json=TWO_NODE_SPEC).raise_for_status().json()["id"]
    _wait(client, job_id, lambda job: job["status"] == "gathering", JOB_TIMEOUT_S)
    time.sleep(3)  # node 0's own second slot has taken the join message by now
    start_second_worker()
    report.two_node_status = _wait_terminal(client, job_id)["status"]


def replay(
    client: httpx.Client, database_url: str, data_dir: Path, env: dict[str, str], lock_s: float
) -> WorkerAttacks:
    """Start the workers (the second one mid-way, for the 2-node job), replay both attacks, stop the workers."""
    report = WorkerAttacks()
    env = {**env, **WORKER_ENV}
    with contextlib.ExitStack() as workers:
        workers.enter_context(worker_process(database_url, data_dir, ROOT, warm=False, env=env, name="worker-1"))
        _wait_workers(client, 1)

        def start_second_worker() -> None:
            workers.enter_context(worker_process(database_url, data_dir, ROOT, warm=False, env=env, name="worker-2"))
            _wait_workers(client, 2)

        two_node_job(client, start_second_worker, report)
        row_lock(client, database_url, data_dir, report, lock_s)
    return report
