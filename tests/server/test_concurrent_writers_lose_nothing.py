"""Variants of field case C23 (Arize-ai/phoenix#3949, PrefectHQ/prefect#10956): concurrent writers lose nothing.

On both backends (``database_url``: the embedded SQLite file and PostgreSQL), writer
threads store the step records of several jobs at once through the worker's
``JobStore`` (one to three records per transaction, lease renewals in between),
while API clients over real HTTP

- request cancellation of half of the jobs (``POST /jobs/{id}/cancel``: a status
  write racing the record writes), and ask again while they are ``cancelling``;
- page through the step records (``GET /jobs/{id}/metrics?after_step=&limit=``) and
  list the jobs (``GET /jobs``).

Right outcome: no "database is locked" (or any other error) reaches anyone; every
record is stored and every job's ``step`` is the last one; every API call succeeds;
each pass of pages is strictly ordered, without gaps or duplicates (a writer commits
its records in step order, so what a reader sees is always a prefix ``1..k``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from api_support import FakeQueue, insert_job
from live_server import LiveServer
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from halfcast.contracts.records import StepRecord as StepLine
from halfcast.core.db.models import Job, StepRow
from halfcast.core.settings import Settings
from server.app import create_app
from worker.store import Fence, JobStore, Progress

log = logging.getLogger(__name__)

JOBS = 6
STEPS = 120
#: Records per page when paging (small, so a pass takes many requests while writes land).
PAGE = 7


@dataclass
class Outcome:
    """What every participant saw: errors, HTTP statuses and the step lists of complete paging passes."""

    errors: list[str] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    passes: list[list[int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)
        log.error("%s", text)


def _write(store: JobStore, fence: Fence, outcome: Outcome) -> None:
    """Store records 1..STEPS of ``fence``'s job in batches of 1 to 3, renewing the lease every 30 steps."""
    try:
        step = 0
        while step < STEPS:
            batch = [
                StepLine(step=n, time=time.time(), loss=1.0 / n, loss_scale=1024.0, overflow=False, skipped_steps=0)
                for n in range(step + 1, min(step + 1 + step % 3 + 1, STEPS + 1))
            ]
            if not store.record_progress(fence, Progress(steps=batch)):
                outcome.error(f"{fence.job_id}: steps {batch[0].step}.. were fenced out")
                return
            step = batch[-1].step
            if step % 30 == 0 and not store.renew_lease(fence, 30.0):
                outcome.error(f"{fence.job_id}: lease lost at step {step}")
    except Exception as exc:  # noqa: BLE001  # any failure of a writer is the test's failure
        outcome.error(f"{fence.job_id}: writer failed: {exc!r}")


def _page_through(http: httpx.Client, job_id: str, outcome: Outcome) -> None:
    """One pass over the job's records, ``PAGE`` at a time, until an empty page."""
    after, steps = 0, []
    while True:
        response = http.get(f"/jobs/{job_id}/metrics", params={"after_step": after, "limit": PAGE})
        with outcome.lock:
            outcome.statuses.append(response.status_code)
        if response.status_code != 200:
            outcome.error(f"GET metrics of {job_id}: {response.status_code} {response.text[:300]}")
            return
        points = response.json()["points"]
        if not points:
            break
        steps += [int(point["step"]) for point in points]
        after = steps[-1]
    with outcome.lock:
        outcome.passes.append(steps)


def _read(http: httpx.Client, job_ids: list[str], stop: threading.Event, outcome: Outcome) -> None:
    """Page through each job in turn and list the jobs, until ``stop``."""
    turn = 0
    while not stop.is_set():
        try:
            _page_through(http, job_ids[turn % len(job_ids)], outcome)
            listed = http.get("/jobs", params={"limit": 50})
            with outcome.lock:
                outcome.statuses.append(listed.status_code)
            if listed.status_code != 200:
                outcome.error(f"GET /jobs: {listed.status_code} {listed.text[:300]}")
        except httpx.HTTPError as exc:
            outcome.error(f"reader: {exc!r}")
        turn += 1


def _cancel(http: httpx.Client, job_ids: list[str], outcome: Outcome) -> None:
    """Ask to cancel each job twice (the second time it is ``cancelling``), spread over the writes."""
    for job_id in job_ids + job_ids:
        time.sleep(0.05)
        try:
            response = http.post(f"/jobs/{job_id}/cancel")
        except httpx.HTTPError as exc:
            outcome.error(f"cancel {job_id}: {exc!r}")
            continue
        with outcome.lock:
            outcome.statuses.append(response.status_code)
        if response.status_code != 202 or response.json()["status"] != "cancelling":
            outcome.error(f"cancel {job_id}: {response.status_code} {response.text[:300]}")


def _claimed_fences(engine: Engine, sessions: sessionmaker[Session], runs_dir: Path) -> list[Fence]:
    """``JOBS`` queued jobs, each claimed and marked running by its own writer."""
    store = JobStore(engine)
    fences = []
    for index in range(JOBS):
        job_id = insert_job(sessions, status="queued", seconds=index)
        claim = store.claim(job_id, f"writer-{index}", runs_dir)
        assert claim is not None and store.mark_running(claim.fence)
        fences.append(claim.fence)
    return fences


def _check_passes(passes: list[list[int]]) -> None:
    """Every pass is a prefix ``1..k``: ordered, no gap, no duplicate."""
    assert passes, "no paging pass completed"
    for steps in passes:
        assert steps == list(range(1, len(steps) + 1)), steps[:50]


def test_writers_of_several_jobs_cancels_and_paged_reads(
    settings: Settings, engine: Engine, sessions: sessionmaker[Session], auth_headers: dict[str, str]
) -> None:
    """C23 variant."""
    fences = _claimed_fences(engine, sessions, settings.runs_dir)
    job_ids = [fence.job_id for fence in fences]
    outcome = Outcome()
    store = JobStore(engine)
    stop = threading.Event()
    with LiveServer(create_app(settings, FakeQueue())) as server:
        clients = [httpx.Client(base_url=server.url, headers=auth_headers, timeout=60) for _ in range(3)]
        readers = [threading.Thread(target=_read, args=(clients[i], job_ids, stop, outcome)) for i in range(2)]
        canceller = threading.Thread(target=_cancel, args=(clients[2], job_ids[::2], outcome))
        writers = [threading.Thread(target=_write, args=(store, fence, outcome)) for fence in fences]
        for thread in [*readers, *writers, canceller]:
            thread.start()
        for thread in [*writers, canceller]:
            thread.join(timeout=240)
        stop.set()
        for thread in readers:
            thread.join(timeout=60)
        final = [_final_pass(clients[0], job_id) for job_id in job_ids]
        for client in clients:
            client.close()
    assert outcome.errors == [], outcome.errors[:5]
    assert outcome.statuses and set(outcome.statuses) <= {200, 202}, sorted(set(outcome.statuses))
    _check_passes(outcome.passes)
    assert final == [list(range(1, STEPS + 1))] * JOBS
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(StepRow)) == JOBS * STEPS
        rows = {row.id: (row.status, row.step) for row in session.scalars(select(Job))}
    assert {rows[job_id] for job_id in job_ids[::2]} == {("cancelling", STEPS)}
    assert {rows[job_id] for job_id in job_ids[1::2]} == {("running", STEPS)}


def _final_pass(http: httpx.Client, job_id: str) -> list[int]:
    outcome = Outcome()
    _page_through(http, job_id, outcome)
    assert outcome.errors == [], outcome.errors
    return outcome.passes[0]
