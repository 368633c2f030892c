"""Faults of the services themselves (issue 4): Redis restarted (mid-job, and empty while jobs wait
queued), PostgreSQL stopped during a job, and 50 jobs submitted at once, on the real stack pointed at
PRIVATE servers (:mod:`private_services`), since the shared ones must never be stopped.

Every test asserts that each job runs exactly once (one attempt, one run directory,
step records 1..N once each) and ends terminal, and that no process of a run is
left after it ended; each logs its row of the fault-injection matrix (fault,
outcome, seconds from the fault to the terminal status, processes left).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from e2e_support import TERMINAL, Stack, load_example, run_processes
from private_services import (  # noqa: F401 (the private_postgres and private_redis fixtures)
    PrivatePostgres,
    PrivateRedis,
    private_postgres_fixture,
    private_redis_fixture,
)

from conftest import make_stack

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

log = logging.getLogger("e2e.service_faults")

#: Lease length on the services stack: longer than the PostgreSQL outage, so the lease survives it.
LEASE_TTL_S = 15.0
#: How long PostgreSQL stays down in the outage test.
POSTGRES_DOWN_S = 8.0
#: CPU jobs one worker runs at once (tiny jobs, mostly torchrun start-up).
CONCURRENCY = "3"
#: Jobs submitted at once on the services stack and on the embedded stack.
SERVICES_BURST = 50
EMBEDDED_BURST = 20


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    private_postgres: PrivatePostgres,
    private_redis: PrivateRedis,
) -> Iterator[Stack]:
    """API + one worker on the private PostgreSQL (migrated by the stack) and the private Redis."""
    yield from make_stack(
        tmp_path_factory.mktemp("service-faults"),
        database_url=private_postgres.url,
        broker_url=private_redis.url,
        worker_concurrency=CONCURRENCY,
        lease_ttl_s=str(LEASE_TTL_S),
        reaper_interval_s="1",
    )


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The embedded stack (SQLite + filesystem broker) with the same worker concurrency."""
    yield from make_stack(tmp_path_factory.mktemp("service-faults-embedded"), worker_concurrency=CONCURRENCY)


def _spec(**overrides: Any) -> dict[str, Any]:
    return load_example("synthetic-fp16.json", **overrides)


def _matrix(fault: str, outcome: str, seconds: float, left: int, **extra: Any) -> None:
    """Log one row of the fault-injection matrix."""
    row = {
        "fault": fault,
        "outcome": outcome,
        "seconds_to_terminal": round(seconds, 1),
        "processes_left": left,
        **extra,
    }
    log.warning("fault matrix: %s", json.dumps(row))


def _outcome(job: dict[str, Any]) -> str:
    return job["status"] + (f"/{job['error']['reason']}" if job["error"] else "")


def _claims(stack: Stack, job_id: str) -> int:
    """How many times a worker claimed the job (its log line per claim, ``worker/runner.py``)."""
    return len(re.findall(rf"job {job_id}: attempt \d+ claimed by ", stack.log_tail("worker", 1_000_000)))


def _assert_ran_once(stack: Stack, job: dict[str, Any], steps: int) -> None:
    """Succeeded in one attempt, one run directory, one claim, and step records 1..steps once each."""
    job_id = job["id"]
    assert job["status"] == "succeeded", job["error"]
    assert [(a["attempt"], a["status"]) for a in job["attempts"]] == [(1, "succeeded")]
    assert sorted(p.name for p in (stack.data_dir / "runs" / job_id).iterdir()) == ["attempt-1"]
    assert _claims(stack, job_id) == 1
    assert [p["step"] for p in stack.metric_points(job_id)] == list(range(1, steps + 1))


def _wait_database(stack: Stack, timeout_s: float = 60) -> None:
    """Wait until the API reads the database again (``/jobs`` answers 200)."""
    deadline = time.monotonic() + timeout_s
    while stack.client.get("/jobs", params={"limit": 1}).status_code != 200:
        assert time.monotonic() < deadline, "the API did not reach the database again"
        time.sleep(0.2)


def test_redis_restarted_during_a_job(stack: Stack, private_redis: PrivateRedis) -> None:
    """Redis stops (losing everything: no persistence) while a job runs, and comes back 4 s later.

    The running job's message was acknowledged at its claim, so the job runs on and
    succeeds once. A job submitted while Redis is down is stored, failed
    ``enqueue_failed`` and answered 503 with ``Retry-After`` (never left ``queued``
    with no message). Once Redis is back, a new job runs (API and worker reconnect).
    """
    steps = 40
    job_id = stack.submit(_spec(max_steps=steps, faults={"sleep_per_step_s": 0.4}))["id"]
    stack.wait(job_id, lambda j: j["status"] == "running" and j["step"] >= 3, timeout_s=120)
    fault_at = time.monotonic()
    private_redis.stop()
    try:
        down = stack.client.post("/jobs", json=_spec(max_steps=5))
        refused_s = time.monotonic() - fault_at
        time.sleep(max(0.0, 4.0 - refused_s))
        assert stack.processes["worker"].poll() is None and run_processes(job_id), "the run or worker died"
    finally:
        private_redis.start()
    job = stack.wait_terminal(job_id, timeout_s=120)
    seconds = time.monotonic() - fault_at
    left = len(run_processes(job_id))
    _matrix("Redis restarted (down 4 s) mid-job", _outcome(job), seconds, left, attempts=len(job["attempts"]))
    assert left == 0
    _assert_ran_once(stack, job, steps)

    assert down.status_code == 503, down.text
    assert down.headers["Retry-After"] == "5" and refused_s < 10
    refused = stack.job(down.json()["job_id"])
    assert (refused["status"], refused["error"]["reason"], refused["attempts"]) == ("failed", "enqueue_failed", [])
    _matrix("submit while Redis is down", f"HTTP 503; {_outcome(refused)}", refused_s, 0)

    after = stack.wait_terminal(stack.submit(_spec(max_steps=5))["id"], timeout_s=120)
    _assert_ran_once(stack, after, 5)


def test_queued_jobs_survive_a_redis_restart_while_no_worker_runs(stack: Stack, private_redis: PrivateRedis) -> None:
    """Jobs wait ``queued`` (their messages only in Redis) when Redis restarts empty and a worker comes back.

    The messages are gone with Redis's data; the rows are not. The worker's broker
    watch finds the marker gone and sends one message per queued job again
    (:mod:`worker.messages.broker_watch`), so each job runs, once.
    """
    stack.kill_worker("worker")
    job_ids = [stack.submit(_spec(max_steps=5))["id"] for _ in range(2)]
    fault_at = time.monotonic()
    private_redis.restart()
    stack.restart_worker("worker")
    for job_id in job_ids:
        job = stack.wait_terminal(job_id, timeout_s=120)
        _matrix(
            "Redis restarted empty while jobs were queued",
            _outcome(job),
            time.monotonic() - fault_at,
            len(run_processes(job_id)),
        )
        _assert_ran_once(stack, job, 5)


def test_postgres_stopped_during_a_job(stack: Stack, private_postgres: PrivatePostgres) -> None:
    """PostgreSQL stops for 8 s (under the 15 s lease) while a job runs, then starts again.

    The worker keeps the run (its lease still holds by its own clock), retries the
    writes that failed, and the job succeeds in its one attempt with every step
    record stored once. Meanwhile the API answers 503 "database unavailable".
    """
    steps = 50
    job_id = stack.submit(_spec(max_steps=steps, faults={"sleep_per_step_s": 0.3}))["id"]
    stack.wait(job_id, lambda j: j["status"] == "running" and j["step"] >= 3, timeout_s=120)
    fault_at = time.monotonic()
    private_postgres.stop()
    try:
        api = stack.client.get(f"/jobs/{job_id}")
        time.sleep(POSTGRES_DOWN_S)
        assert stack.processes["worker"].poll() is None and run_processes(job_id), "the run or worker died"
    finally:
        private_postgres.start()
    _wait_database(stack)
    job = stack.wait_terminal(job_id, timeout_s=120)
    seconds = time.monotonic() - fault_at
    left = len(run_processes(job_id))
    _matrix(
        f"PostgreSQL stopped {POSTGRES_DOWN_S:.0f} s mid-job",
        _outcome(job),
        seconds,
        left,
        attempts=len(job["attempts"]),
    )
    assert api.status_code == 503 and api.json()["detail"] == "database unavailable", api.text
    assert left == 0
    _assert_ran_once(stack, job, steps)


def _burst(stack: Stack, count: int, label: str) -> None:
    """Submit ``count`` tiny jobs from ``count`` threads at once; each must run exactly once and succeed."""
    spec = _spec(max_steps=3)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=count) as pool:
        ids = [job["id"] for job in pool.map(lambda _: stack.submit(spec), range(count))]
    assert len(set(ids)) == count
    jobs = _wait_all_terminal(stack, set(ids), timeout_s=600)
    seconds = time.monotonic() - started
    left = sum(len(run_processes(job_id)) for job_id in ids)
    outcomes = sorted({_outcome(job) for job in jobs.values()})
    _matrix(f"{count} jobs submitted at once ({label})", ",".join(outcomes), seconds, left)
    assert left == 0
    assert outcomes == ["succeeded"], [job["error"] for job in jobs.values() if job["error"]]
    for job in jobs.values():
        _assert_ran_once(stack, job, 3)


def _wait_all_terminal(stack: Stack, ids: set[str], timeout_s: float) -> dict[str, dict[str, Any]]:
    """Poll ``GET /jobs`` until every job of ``ids`` is terminal; return them by id (fail after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        listed = stack.client.get("/jobs", params={"limit": 1000}).json()["jobs"]
        jobs = {job["id"]: job for job in listed if job["id"] in ids}
        if len(jobs) == len(ids) and all(job["status"] in TERMINAL for job in jobs.values()):
            return {job_id: stack.job(job_id) for job_id in ids}
        if time.monotonic() > deadline:
            stuck = {job["id"]: job["status"] for job in jobs.values() if job["status"] not in TERMINAL}
            pytest.fail(f"jobs not terminal after {timeout_s} s: {stuck}\n{stack.log_tail('worker')}")
        time.sleep(1.0)


def test_fifty_jobs_submitted_at_once_on_postgres_and_redis(stack: Stack) -> None:
    """50 submissions from 50 threads (after the faults above): each job runs once and succeeds.

    Over 60 s (about 90 s alone, 150 s beside other workers): 50 real runs, each a torchrun and its
    ranks importing torch, through one worker's slots; fewer jobs would not fill the queue the burst is about.
    """
    _burst(stack, SERVICES_BURST, "PostgreSQL + Redis")


def test_jobs_submitted_at_once_on_the_embedded_stack(embedded: Stack) -> None:
    """The embedded stack (SQLite, filesystem broker) under 20 simultaneous submissions.

    About 40 s alone, up to 60 s beside other workers: 20 real runs, each a torchrun importing torch.
    """
    _burst(embedded, EMBEDDED_BURST, "SQLite + filesystem broker")


def test_no_job_of_the_services_stack_is_left_live(stack: Stack) -> None:
    """Nothing stuck in ``queued``, ``starting``, ``running`` or ``cancelling`` after the faults."""
    jobs = stack.client.get("/jobs", params={"limit": 1000}).json()["jobs"]
    assert jobs and all(job["status"] in TERMINAL for job in jobs), [j["status"] for j in jobs]
