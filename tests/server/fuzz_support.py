"""Helpers of the API fuzz tests (imported as ``fuzz_support``; pytest puts this folder on ``sys.path``).

- :func:`make_tokens` makes an admin token and a plain one (owner :data:`SEED_OWNER`).
- :func:`seed_jobs` stores one job in every status (owned by :data:`SEED_OWNER`) (with attempts, step records and a
  rank log where the status implies them, and adapter and model exports for the succeeded one) and a worker
  with one GPU, so the fuzzer's
  requests reach past the 404s into the real code paths.
- :func:`check_error_body` is the contract of every 4xx body (docs/api.md, "Errors").
- :func:`fingerprint` and :func:`database_problems` say whether the database changed
  and whether it holds anything half-written.
- :func:`numeric_paths`, :func:`node_paths` and :func:`with_literal` write a valid body
  back as raw text with a non-strict-JSON number (:data:`NONFINITE_LITERALS`) at one
  position: what schemathesis, which only generates strict JSON, never sends.
"""

from __future__ import annotations

import copy
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from halfcast.common.strict_json import JsonPath
from halfcast.contracts.rundir import JobRuns
from halfcast.contracts.spec import JobSpec
from halfcast.core.db import tokens
from halfcast.core.db.jobs import spec_hash
from halfcast.core.db.models import (
    STATUSES,
    TERMINAL_STATUSES,
    Attempt,
    Job,
    RegisteredDataset,
    RegisteredModel,
    StepRow,
    Worker,
)
from halfcast.core.registry.layout import RegistryLayout
from server.schemas import job_public

#: Numbers Python's JSON parser reads but JSON does not have (the last two overflow a double).
NONFINITE_LITERALS = ("NaN", "Infinity", "-Infinity", "1e309", "-1e309")

#: The spec of every seeded job (valid, CPU, two ranks so that rank 1 exists).
SEED_SPEC: dict[str, Any] = JobSpec.model_validate(
    {
        "name": "fuzz-seed",
        "model": {"name": "mlp"},
        "dataset": {"name": "digits"},
        "precision": "fp16",
        "processes": 2,
        "max_steps": 20,
    }
).model_dump(mode="json")

#: Owner of the seeded jobs and of the ``user`` token.
SEED_OWNER = "fuzz-user"

_BASE = datetime(2030, 1, 1, tzinfo=UTC)


@dataclass
class Seeded:
    """Ids of the seeded jobs: all of them, and those already terminal (their streams end at once)."""

    all_ids: list[str] = field(default_factory=list)
    terminal_ids: list[str] = field(default_factory=list)


def _attempts_for(status: str) -> int:
    return 0 if status == "queued" else 1


def _job_row(status: str, index: int) -> Job:
    created = _BASE + timedelta(seconds=index)
    terminal = status in TERMINAL_STATUSES
    return Job(
        id=str(uuid.uuid4()),
        name=SEED_SPEC["name"],
        status=status,
        spec=dict(SEED_SPEC),
        created_at=created,
        updated_at=created,
        step=0,
        max_steps=SEED_SPEC["max_steps"],
        world_size=2,
        attempt=_attempts_for(status),
        started_at=None if status == "queued" else created,
        finished_at=created + timedelta(seconds=30) if terminal else None,
        error_reason="training_error" if status == "failed" else None,
        error_message="seeded failure" if status == "failed" else None,
        owner=SEED_OWNER,
    )


def _step_data(step: int) -> dict[str, Any]:
    return {
        "step": step,
        "time": 1000.0 + step,
        "loss": 1.0 / step,
        "loss_scale": 1024.0,
        "overflow": False,
        "skipped_steps": 0,
        "grad_norm": 0.5,
        "lr": 0.001,
        "samples_per_second": 500.0,
        "tokens_per_second": None,
    }


def _add_history(session: Session, job: Job, runs_dir: Path) -> None:
    """Attempt row, three step records and a rank-0 log for a job that has started."""
    if job.attempt == 0:
        return
    ended = job.status in TERMINAL_STATUSES
    session.add(
        Attempt(
            job_id=job.id,
            attempt=1,
            worker_id="fuzz-host/1",
            started_at=job.created_at,
            ended_at=job.finished_at if ended else None,
            status=job.status if ended else None,
            reason=job.error_reason,
        )
    )
    for step in (1, 2, 3):
        session.add(StepRow(job_id=job.id, step=step, time=1000.0 + step, data=_step_data(step)))
    job.step, job.latest = 3, _step_data(3)
    log_path = JobRuns.of(runs_dir, job.id).attempt(1).rank_log(0)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("".join(f"rank 0 line {n}\n" for n in range(5)))
    if job.status == "succeeded":
        adapter = JobRuns.of(runs_dir, job.id).attempt(1).export_of("adapter")
        adapter.mkdir(parents=True)
        (adapter / "adapter_config.json").write_text('{"r": 8}')
        model = adapter.parent / "model"  # registrable: POST /jobs/{id}/exports/model/register reaches its 201
        model.mkdir()
        (model / "config.json").write_text('{"model_type": "llama"}')
        (model / "model.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{}      ")


def seed_jobs(sessions: sessionmaker[Session], runs_dir: Path) -> Seeded:
    """Store one job per status and one registered worker (1 GPU); return the job ids."""
    seeded = Seeded()
    now = datetime.now(UTC)
    with sessions() as session:
        for index, status in enumerate(STATUSES):
            job = _job_row(status, index)
            session.add(job)
            session.flush()
            _add_history(session, job, runs_dir)
            seeded.all_ids.append(job.id)
            if status in TERMINAL_STATUSES:
                seeded.terminal_ids.append(job.id)
        session.add(
            Worker(
                id="fuzz-host/1", hostname="fuzz-host", pid=1, gpus=[0], concurrency=1, started_at=now, heartbeat_at=now
            )
        )
        session.commit()
    return seeded


def make_tokens(sessions: sessionmaker[Session]) -> dict[str, str]:
    """Secrets of an ``admin`` token and a ``user`` token (owner :data:`SEED_OWNER`)."""
    with sessions() as session:
        admin = tokens.create_token(session, "fuzz-admin", admin=True, actor="fuzz-setup")
        user = tokens.create_token(session, SEED_OWNER, actor="fuzz-setup")
    return {"admin": admin.secret, "user": user.secret}


# ----------------------------------------------------------------------------- response contract


def check_error_body(status_code: int, content_type: str, body: Any) -> None:
    """Raise ``AssertionError`` unless a 4xx body is JSON naming the problem.

    422: ``{"detail": [{"loc": [...], "msg": "...", "field": [...]}, ...]}`` (FastAPI's format, ``loc``
    non-empty, and Halfcast's ``field``); any other 4xx: ``{"detail": "<non-empty text>"}``.
    """
    assert content_type.startswith("application/json"), f"{status_code} answered with {content_type!r}, not JSON"
    assert isinstance(body, dict) and "detail" in body, f"{status_code} body has no 'detail': {body!r}"
    detail = body["detail"]
    if status_code == 422:
        assert isinstance(detail, list) and detail, f"422 detail is not a non-empty list: {detail!r}"
        for item in detail:
            assert isinstance(item, dict), f"422 detail item is not an object: {item!r}"
            assert isinstance(item.get("loc"), list) and item["loc"], f"422 item names no field: {item!r}"
            assert isinstance(item.get("msg"), str) and item["msg"], f"422 item has no message: {item!r}"
            assert isinstance(item.get("field"), list), f"422 item has no field path: {item!r}"
    else:
        assert isinstance(detail, str) and detail.strip(), f"{status_code} detail is not a message: {detail!r}"


# ----------------------------------------------------------------------------- database state


#: The tables the API writes (a request answered 4xx must leave each one's row count as it was).
_WRITTEN_TABLES = (Job, Attempt, StepRow, Worker, RegisteredDataset, RegisteredModel)


def fingerprint(sessions: sessionmaker[Session]) -> tuple[Any, ...]:
    """Row counts of every table the API writes, and the newest job change: equal means nothing was written.

    One statement (scalar subqueries), as it runs around every fuzzed request.
    """
    counts = [select(func.count()).select_from(table).scalar_subquery() for table in _WRITTEN_TABLES]
    newest_change = select(func.max(Job.updated_at)).scalar_subquery()
    with sessions() as session:
        return tuple(session.execute(select(*counts, newest_change)).one())


def _spec_problems(job: Job) -> list[str]:
    try:
        spec = JobSpec.model_validate(job.spec)
        json.dumps(job.spec, allow_nan=False)
    except ValidationError as exc:
        return [f"job {job.id}: stored spec does not validate: {exc}"]
    except ValueError as exc:
        return [f"job {job.id}: stored spec is not strict JSON (it could not be served): {exc}"]
    problems = []
    if (job.name, job.max_steps, job.world_size) != (spec.name, spec.max_steps, spec.world_size):
        problems.append(f"job {job.id}: name/max_steps/world_size disagree with the spec")
    if (job.idempotency_key is None) != (job.request_hash is None):
        problems.append(f"job {job.id}: idempotency key and request hash not stored together")
    if job.request_hash is not None and job.request_hash != spec_hash(spec):
        problems.append(f"job {job.id}: request hash is not the spec's")
    return problems


def _status_problems(job: Job) -> list[str]:
    problems = []
    if job.status not in STATUSES:
        problems.append(f"job {job.id}: unknown status {job.status!r}")
    if job.status == "queued" and (job.attempt, job.started_at, job.finished_at) != (0, None, None):
        problems.append(f"job {job.id}: queued but attempt {job.attempt}, started {job.started_at}")
    if job.status in TERMINAL_STATUSES and job.finished_at is None:
        problems.append(f"job {job.id}: {job.status} without finished_at")
    if (job.status == "failed") != (job.error_reason is not None):
        problems.append(f"job {job.id}: status {job.status} with error reason {job.error_reason!r}")
    if [row.attempt for row in job.attempts] != list(range(1, job.attempt + 1)):
        problems.append(f"job {job.id}: attempt {job.attempt} but attempt rows {[r.attempt for r in job.attempts]}")
    return problems


def _orphan_problems(session: Session) -> list[str]:
    job_ids = select(Job.id)
    orphans = session.scalar(select(func.count()).select_from(StepRow).where(StepRow.job_id.not_in(job_ids)))
    lost = session.scalar(select(func.count()).select_from(Attempt).where(Attempt.job_id.not_in(job_ids)))
    return [f"{n} {what} of missing jobs" for n, what in ((orphans, "step records"), (lost, "attempts")) if n]


def _registry_problems(session: Session, registry: Path) -> list[str]:
    """Registered rows without their file, files without a row, leftovers of uploads."""
    layout = RegistryLayout(registry)
    problems = []
    datasets = {layout.dataset_file(row.sha256, row.file_format) for row in session.scalars(select(RegisteredDataset))}
    models = {layout.model_dir(row.id) for row in session.scalars(select(RegisteredModel))}
    present = set(layout.datasets.iterdir()) if layout.datasets.is_dir() else set()
    present_models = set(layout.models.iterdir()) if layout.models.is_dir() else set()
    problems += [f"dataset file {path.name} has no row" for path in sorted(present - datasets)]
    problems += [f"a dataset row has no file {path.name}" for path in sorted(datasets - present)]
    problems += [f"model directory {path.name} has no row" for path in sorted(present_models - models)]
    problems += [f"a model row has no directory {path.name}" for path in sorted(models - present_models)]
    for leftover in ("staging", "trash"):
        folder = registry / f".{leftover}"
        if folder.is_dir() and any(folder.iterdir()):
            problems.append(
                f"the registry's .{leftover} folder is not empty: {sorted(p.name for p in folder.iterdir())}"
            )
    return problems


def database_problems(sessions: sessionmaker[Session], registry: Path | None = None) -> list[str]:
    """Everything half-written or inconsistent in the database (empty: all is well).

    Every job's spec validates as a ``JobSpec``, is strict JSON and agrees with its columns; its status
    is known and its timestamps, error and attempts fit the status; it renders as the
    job resource; no step record or attempt belongs to a missing job. With ``registry`` (the registry
    directory), every registered dataset and model has its file and every file its row, and no upload
    left anything in staging or trash.
    """
    problems: list[str] = []
    with sessions() as session:
        if registry is not None:
            problems += _registry_problems(session, registry)
        for job in session.scalars(select(Job)):
            problems += _spec_problems(job) + _status_problems(job)
            try:
                job_public(job)
            except ValidationError as exc:
                problems.append(f"job {job.id}: does not render as a job resource: {exc}")
        problems += _orphan_problems(session)
    return problems


def _positions(value: Any, path: JsonPath = ()) -> list[tuple[JsonPath, Any]]:
    """``(path, node)`` of every node of a JSON value, the root first."""
    found = [(path, value)]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _positions(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _positions(child, (*path, index))
    return found


def numeric_paths(value: Any) -> list[JsonPath]:
    """Where ``value`` holds a number (``bool`` is not one)."""
    return [path for path, node in _positions(value) if isinstance(node, (int, float)) and not isinstance(node, bool)]


def node_paths(value: Any) -> list[JsonPath]:
    """Every position of ``value``, the root included."""
    return [path for path, _node in _positions(value)]


def with_literal(body: Any, path: JsonPath, literal: str) -> str:
    """``body`` as JSON text with the raw ``literal`` (``NaN``, ``1e309``) at ``path`` in place of what was there."""
    hole = f"@@{uuid.uuid4().hex}@@"
    if not path:
        return literal
    document = copy.deepcopy(body)
    parent = document
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = hole
    return json.dumps(document, allow_nan=False).replace(json.dumps(hole), literal)
