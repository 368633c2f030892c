"""Start-up ``phase`` records (issue 13 item 3): the job row keeps the attempt's newest one; a claim clears it.

Runs on SQLite and on the real PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from sqlalchemy import Engine, event, update
from sqlalchemy.orm import Session
from worker_support import insert_job, present

from halfcast.core.db.models import Job
from worker.runner import Attempt
from worker.store import JobStore, Progress

TIMES = {"launch_s": 1.5, "imports_s": 6.0, "data_s": None, "model_s": None, "first_step_s": None}


def _phase(phase: str, **times: Any) -> dict[str, Any]:
    return {"type": "phase", "time": 10.0, "phase": phase, "startup": {**TIMES, **times}}


def _progress(records: list[dict[str, Any]]) -> Progress:
    """What the runner makes of one drain of records."""
    return Attempt._progress(cast(Attempt, SimpleNamespace(end=None)), records)  # only its end is read


def _startup(db: Engine, job_id: str) -> Any:
    with Session(db) as session:
        return session.get_one(Job, job_id).startup


def test_the_newest_phase_record_is_kept_and_the_next_claim_clears_it(db: Engine, tmp_path: Path) -> None:
    store = JobStore(db)
    job_id = insert_job(db)
    claim = store.claim(job_id, "w", tmp_path)
    assert claim is not None and _startup(db, job_id) is None
    assert store.record_progress(claim.fence, _progress([_phase("data")]))
    assert _startup(db, job_id) == {"phase": "data", **TIMES}
    drain = [
        _phase("model", data_s=0.25),
        _phase("first_step", data_s=0.25, model_s=0.5),
        {"type": "start", "world_size": 1},
    ]
    assert store.record_progress(claim.fence, _progress(drain))
    assert _startup(db, job_id) == {"phase": "first_step", **TIMES, "data_s": 0.25, "model_s": 0.5}
    assert store.record_progress(claim.fence, _progress([{"type": "step", "step": 1, "time": 11.0}]))
    assert _startup(db, job_id)["phase"] == "first_step"  # a poll without a phase record leaves it
    with db.begin() as conn:  # the attempt ended and the job went back to the queue (a retry)
        conn.execute(update(Job).where(Job.id == job_id).values(status="queued"))
    assert store.claim(job_id, "w", tmp_path) is not None and _startup(db, job_id) is None


@pytest.mark.parametrize("bad", [
    {"type": "phase", "phase": "sleeping", "startup": TIMES},
    {"type": "phase", "startup": TIMES},
    {"type": "phase", "phase": "model", "startup": {**TIMES, "data_s": -1.0}},
    {"type": "phase", "phase": "model", "startup": {**TIMES, "data_s": "soon"}},
])  # fmt: skip  # a case table, laid out by hand
def test_a_phase_record_that_does_not_validate_is_skipped(bad: dict[str, Any]) -> None:
    assert _progress([_phase("data"), bad]).startup == {"phase": "data", **TIMES}
    assert _progress([bad]).startup is None


def test_the_first_records_start_the_job_running_with_their_phase_in_one_write(db: Engine, tmp_path: Path) -> None:
    """A reader never sees ``running`` without the phase of the records that started it (no ``running``/no phase blip)."""
    store = JobStore(db)
    job_id = insert_job(db)
    claim = store.claim(job_id, "w", tmp_path)
    assert claim is not None
    seen: list[tuple[str, Any]] = []

    def watch(conn: Any, *_args: Any) -> None:  # every committed state, as a poller would read it
        with Session(db) as session:
            job = session.get_one(Job, job_id)
            seen.append((job.status, (job.startup or {}).get("phase")))

    event.listen(db, "commit", watch)
    try:
        assert store.record_progress(claim.fence, _progress([_phase("data")]), start_running=True)
    finally:
        event.remove(db, "commit", watch)
    with Session(db) as session:
        job = session.get_one(Job, job_id)
        assert (job.status, present(job.startup)["phase"]) == ("running", "data")
    assert ("running", None) not in seen


DATA = {
    "format": "chat",
    "masking": "assistant",
    "rows": 36,
    "train_examples": 28,
    "held_out_examples": 1,
    "truncated": 0,
    "dropped_rows": {"train": 4, "held_out": 2},
    "pad_token": {"id": 2, "token": "</s>", "source": "eos"},
}


def test_the_start_records_data_report_is_kept_on_the_job(db: Engine, tmp_path: Path) -> None:
    """Issue 25 item 6: the pad token, the rows dropped per split and the held-out size reach the job row."""
    store = JobStore(db)
    job_id = insert_job(db)
    claim = store.claim(job_id, "w", tmp_path)
    assert claim is not None
    assert store.record_progress(claim.fence, _progress([{"type": "start", "world_size": 1, "data": DATA}]))
    with Session(db) as session:
        assert session.get_one(Job, job_id).data_report == DATA
    assert store.record_progress(claim.fence, _progress([{"type": "step", "step": 1, "time": 11.0}]))
    with Session(db) as session:
        assert session.get_one(Job, job_id).data_report == DATA  # a poll without a start record leaves it
