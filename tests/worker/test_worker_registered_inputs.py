"""The worker fills a job's registered dataset into the run's ``spec.json`` (the stored spec stays as submitted)
and fails an attempt whose registered dataset or model was deleted since the submission."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select
from worker_support import fake_command, insert_job

from server.db.models import Job, RegisteredDataset, RegisteredModel, utcnow
from server.settings import Settings
from trainer.spec import JobSpec
from worker.runner import RunnerContext, run_job
from worker.store import JobStore

SHA = "ab" * 32


def _spec(dataset: dict[str, Any], model: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = {
        "model": {"name": "hf", "config": model or {"path": "tiny"}},
        "dataset": {"name": "jsonl", "config": dataset},
        "max_steps": 3,
    }
    return JobSpec.model_validate(spec).model_dump(mode="json")


def _registered(db: Engine) -> tuple[str, str]:
    dataset_id, model_id = str(uuid.uuid4()), str(uuid.uuid4())
    with db.begin() as conn:
        conn.execute(
            insert(RegisteredDataset).values(
                id=dataset_id,
                owner="alice",
                name="d",
                format="chat",
                file_format="jsonl",
                rows=3,
                bytes=10,
                sha256=SHA,
                created_at=utcnow(),
            )
        )
        conn.execute(
            insert(RegisteredModel).values(
                id=model_id,
                owner="alice",
                name="m",
                model_type="llama",
                files=3,
                bytes=10,
                sha256=SHA,
                created_at=utcnow(),
            )
        )
    return dataset_id, model_id


def _run(db: Engine, settings: Settings, spec: dict[str, Any]) -> tuple[Job, str]:
    job_id = insert_job(db, spec)
    run_job(
        job_id,
        RunnerContext(settings=settings, store=JobStore(db), worker_id="test-worker", build_command=fake_command),
    )
    with db.connect() as conn:
        row = conn.execute(select(Job).where(Job.id == job_id)).one()
    return row, job_id  # type: ignore[return-value]


def test_the_runs_spec_gets_the_registered_datasets_format_file_format_and_sha256(
    db: Engine, settings: Settings
) -> None:
    dataset_id, model_id = _registered(db)
    spec = _spec({"dataset_id": dataset_id, "masking": "last"}, {"model_id": model_id})
    row, job_id = _run(db, settings, spec)
    assert (row.status, row.error_reason) == ("succeeded", None), row.error_message
    written = json.loads((settings.runs_dir / job_id / "attempt-1" / "spec.json").read_text())
    config = written["dataset"]["config"]
    assert (config["dataset_id"], config["format"], config["file_format"], config["sha256"]) == (
        dataset_id,
        "chat",
        "jsonl",
        SHA,
    )
    assert written["model"]["config"]["model_id"] == model_id
    assert row.spec == spec  # stored as submitted


@pytest.mark.parametrize(("missing", "reason"), [("dataset", "data_unavailable"), ("model", "model_unavailable")])
def test_an_input_deleted_after_submission_fails_the_attempt(
    db: Engine, settings: Settings, missing: str, reason: str
) -> None:
    dataset_id, model_id = _registered(db)
    gone = str(uuid.uuid4())
    spec = _spec(
        {"dataset_id": gone if missing == "dataset" else dataset_id},
        {"model_id": gone if missing == "model" else model_id},
    )
    row, job_id = _run(db, settings, spec)
    assert (row.status, row.error_reason) == ("failed", reason)
    assert gone in row.error_message and "deleted after the job was submitted" in row.error_message
    assert not (settings.runs_dir / job_id / "attempt-1" / "spec.json").exists()
