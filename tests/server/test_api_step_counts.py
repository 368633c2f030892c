"""The job resource's ``applied_steps`` and ``skipped_steps``: from the latest step record, one trajectory.

The latest record's ``skipped_steps`` is cumulative, and the worker rewinds ``latest`` with the
stored records (a precision switch, a retry's resume), so the counts follow the trajectory the
job is on. Runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from api_support import app_state, insert_job, insert_steps
from fastapi.testclient import TestClient
from sqlalchemy import Engine, update
from sqlalchemy.orm import Session, sessionmaker

from halfcast.contracts.records import EndRecord, PrecisionSwitchRecord, StepRecord
from halfcast.core.db.models import Job
from worker.records.ingest import end_info
from worker.store import JobStore, Progress


def _counts(client: TestClient, job_id: str) -> tuple[int, int, int]:
    job = client.get(f"/jobs/{job_id}").json()
    [listed] = [j for j in client.get("/jobs").json()["jobs"] if j["id"] == job_id]
    assert (listed["applied_steps"], listed["skipped_steps"]) == (job["applied_steps"], job["skipped_steps"])
    return job["step"], job["applied_steps"], job["skipped_steps"]


def _step(step: int, skipped: int, **extra: Any) -> StepRecord:
    return StepRecord.model_validate(
        {"step": step, "time": float(step), "loss": 1.0, "overflow": False, "skipped_steps": skipped, **extra}
    )


def test_the_resource_counts_applied_and_skipped_steps(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions, status="running")
    assert _counts(client, job_id) == (0, 0, 0)  # no step record yet
    insert_steps(sessions, job_id, range(1, 6))  # step 3 overflowed
    with sessions() as session:
        session.execute(update(Job).where(Job.id == job_id).values(step=5, latest=_step(5, 1).body()))
        session.commit()
    assert _counts(client, job_id) == (5, 4, 1)


def test_the_counts_follow_a_precision_switch_and_a_retry_rewind(
    client: TestClient, engine: Engine, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """fp16 steps 9-12 skipped, then the switch back to step 8 and a clean bf16 re-run; then a retry
    that resumes from step 9: the counts are those of the steps the job kept, never the abandoned ones."""
    store = JobStore(engine)
    claim = store.claim(insert_job(sessions), "w", tmp_path)
    assert claim is not None
    fp16 = [_step(s, max(0, s - 8), overflow=s > 8) for s in range(1, 13)]
    assert store.record_progress(claim.fence, Progress(steps=fp16))
    assert _counts(client, claim.job_id) == (12, 8, 4)
    switch = PrecisionSwitchRecord.model_validate(
        {
            "step": 12,
            "from": "fp16",
            "to": "bf16",
            "message": "m",
            "reason": "loss_scale_collapsed",
            "rewound_to_step": 8,
            "time": 1.0,
        }
    )
    bf16 = [_step(s, 0, precision="bf16") for s in (9, 10, 11)]
    assert store.record_progress(claim.fence, Progress(steps=bf16, switches=[switch]))
    assert _counts(client, claim.job_id) == (11, 11, 0)
    assert store.rewind(claim.fence, 9)
    assert _counts(client, claim.job_id) == (9, 9, 0)


def test_an_early_stop_shows_on_the_resource_and_final_pt_holds_its_step(
    client: TestClient, engine: Engine, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """The worker keeps the succeeded run's end record (``jobs.end_info``); the resource shows its
    ``stopped_early`` and ``exported_step``, and the checkpoint list gives ``final.pt`` the step it stopped at."""
    store = JobStore(engine)
    claim = store.claim(insert_job(sessions), "w", tmp_path)
    assert claim is not None
    end = EndRecord.model_validate(
        {
            "steps": 30,
            "skipped_steps": 2,
            "applied_steps": 28,
            "exported_step": 20,
            "stopped_early": {"step": 30, "metric": "loss", "best_step": 20, "best_value": 0.5},
        }
    )
    assert store.finish(claim.fence, "succeeded", end_info=end_info(end))
    job = client.get(f"/jobs/{claim.job_id}").json()
    assert job["stopped_early"] == {"step": 30, "metric": "loss", "best_step": 20, "best_value": 0.5}
    assert job["exported_step"] == 20
    runs_dir = app_state(client.app).settings.runs_dir
    final = runs_dir / claim.job_id / "attempt-1" / "checkpoints" / "final.pt"
    final.parent.mkdir(parents=True)
    final.write_bytes(b"x")
    [listed] = client.get(f"/jobs/{claim.job_id}/checkpoints").json()["checkpoints"]
    assert (listed["name"], listed["step"]) == ("final.pt", 30)


def test_empty_windows_are_not_applied_steps(
    client: TestClient, engine: Engine, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """Issue 25 item 7: the step records cannot tell an empty window (no supervised token: no update) from an
    applied step; the end record can, and the resource of a finished job takes its count."""
    store = JobStore(engine)
    claim = store.claim(insert_job(sessions), "w", tmp_path)
    assert claim is not None
    with sessions() as session:
        session.execute(update(Job).where(Job.id == claim.job_id).values(step=5, latest=_step(5, 1).body()))
        session.commit()
    end = EndRecord.model_validate({"steps": 5, "skipped_steps": 1, "empty_windows": 2, "applied_steps": 2})
    assert store.finish(claim.fence, "succeeded", end_info=end_info(end))
    assert _counts(client, claim.job_id) == (5, 2, 1)


def test_a_succeeded_job_shows_its_whole_run_throughput(
    client: TestClient, engine: Engine, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """Issue 25 item 9: the headline figure is the end record's whole-run rate, not the last step record's window."""
    store = JobStore(engine)
    claim = store.claim(insert_job(sessions), "w", tmp_path)
    assert claim is not None
    end = EndRecord.model_validate(
        {"steps": 5, "skipped_steps": 0, "applied_steps": 5, "samples_per_second": 3125.5, "tokens_per_second": None}
    )
    assert store.finish(claim.fence, "succeeded", end_info=end_info(end))
    assert client.get(f"/jobs/{claim.job_id}").json()["throughput"] == {
        "samples_per_second": 3125.5,
        "tokens_per_second": None,
    }
    assert client.get(f"/jobs/{insert_job(sessions, status='running')}").json()["throughput"] is None


def test_the_job_resource_shows_what_the_job_read_and_chose(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    """Issue 25 item 6: the start record's data report (pad token, dropped rows per split, held-out size)."""
    job_id = insert_job(sessions, status="running")
    report = {
        "rows": 3,
        "train_examples": 2,
        "held_out_examples": 1,
        "dropped_rows": {"train": 0, "held_out": 2},
        "pad_token": {"id": 2, "token": "</s>", "source": "eos"},
        "masking": "assistant",
    }
    with sessions() as session:
        session.execute(update(Job).where(Job.id == job_id).values(data_report=report))
        session.commit()
    data = client.get(f"/jobs/{job_id}").json()["data"]
    assert data["dropped_rows"] == {"train": 0, "held_out": 2} and data["held_out_examples"] == 1
    assert data["pad_token"] == {"id": 2, "token": "</s>", "source": "eos"} and data["masking"] == "assistant"
    assert client.get(f"/jobs/{insert_job(sessions)}").json()["data"] is None


def test_a_job_without_an_end_record_shows_no_early_stop(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job = client.get(f"/jobs/{insert_job(sessions, status='running')}").json()
    assert job["stopped_early"] is None and job["exported_step"] is None
