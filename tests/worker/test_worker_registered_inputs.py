"""The worker fills a job's registered dataset into the run's ``spec.json`` (the stored spec stays as submitted)
and fails an attempt whose registered dataset, model or ``resume_from`` job was deleted since the submission,
or is not the job owner's to read (issue 24 item 1: checked again before the worker opens anything)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, insert
from worker_support import fake_command, insert_job, job_row, present

from halfcast.contracts.spec import JobSpec
from halfcast.core.db.engine import make_session_factory
from halfcast.core.db.models import Job, RegisteredDataset, RegisteredModel, utcnow
from halfcast.core.db.tokens import create_token
from halfcast.core.settings import Settings
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


def _run(db: Engine, settings: Settings, spec: dict[str, Any], owner: str = "alice") -> tuple[Job, str]:
    job_id = insert_job(db, spec, owner=owner)
    run_job(
        job_id,
        RunnerContext(settings=settings, store=JobStore(db), worker_id="test-worker", build_command=fake_command),
    )
    return job_row(db, job_id), job_id


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
    assert gone in present(row.error_message) and "deleted since the job was submitted" in present(row.error_message)
    assert not (settings.runs_dir / job_id / "attempt-1" / "spec.json").exists()


def _stolen_spec(db: Engine, stolen: str) -> dict[str, Any]:
    dataset_id, model_id = _registered(db)
    if stolen == "dataset":
        return _spec({"dataset_id": dataset_id})
    if stolen == "model":
        return _spec({"path": "train.jsonl", "format": "chat"}, {"model_id": model_id})
    alices_job = insert_job(db, _spec({"path": "train.jsonl", "format": "chat"}), status="succeeded", owner="alice")
    return {
        **_spec({"path": "train.jsonl", "format": "chat"}),
        "resume_from": f"{alices_job}/attempt-1/checkpoints/final.pt",
    }


@pytest.mark.parametrize(
    ("stolen", "reason"),
    [("dataset", "data_unavailable"), ("model", "model_unavailable"), ("job", "checkpoint_unavailable")],
)
def test_a_stored_spec_naming_another_owners_input_fails_before_anything_is_opened(
    db: Engine, settings: Settings, stolen: str, reason: str
) -> None:
    """As if the API's check were bypassed (a spec written by an older server, a row edited): bob's job names alice's."""
    row, job_id = _run(db, settings, _stolen_spec(db, stolen), owner="bob")
    assert (row.status, row.error_reason) == ("failed", reason), row.error_message
    assert "not the job owner's to read" in present(row.error_message)
    assert not (settings.runs_dir / job_id / "attempt-1" / "spec.json").exists()


def test_an_admins_job_may_name_another_owners_dataset_and_model(db: Engine, settings: Settings) -> None:
    with make_session_factory(db)() as session:
        create_token(session, "root", admin=True, actor="cli:test")
    dataset_id, model_id = _registered(db)
    row, _ = _run(db, settings, _spec({"dataset_id": dataset_id}, {"model_id": model_id}), owner="root")
    assert (row.status, row.error_reason) == ("succeeded", None), row.error_message
