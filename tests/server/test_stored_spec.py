"""A job's stored spec read back as a validated ``JobSpec`` (:mod:`halfcast.core.db.stored_spec`), and what the job
resource derives from it: cached per job, a stored spec that no longer validates served as stored (never a 5xx)."""

from __future__ import annotations

import copy
import logging
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from api_support import VALID_SPEC
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from halfcast.contracts.spec import JobSpec
from halfcast.core.db import stored_spec as stored_specs
from halfcast.core.db.members import spec_gpus, spec_nodes
from halfcast.core.db.models import Job
from halfcast.core.db.stored_spec import StoredSpecs
from server.schemas import job_public

#: A spec stored by an older Halfcast: its model has since left the catalog (it no longer validates).
STALE_SPEC: dict[str, Any] = {**VALID_SPEC, "model": {"name": "retired-model"}, "nodes": 2}
SWITCH = {
    "step": 3,
    "from": "fp16",
    "to": "bf16",
    "reason": "loss_scale_collapsed",
    "message": "m",
    "rewound_to_step": 2,
    "time": 1.0,
}


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The job ids validated from here on (each a cache miss)."""
    seen: list[str] = []
    validate = stored_specs.validate_stored

    def counted(job_id: str, stored: object) -> JobSpec | None:
        seen.append(job_id)
        return validate(job_id, stored)

    monkeypatch.setattr(stored_specs, "validate_stored", counted)
    return seen


def _job(spec: dict[str, Any], **fields: Any) -> Job:
    now = datetime(2026, 1, 2, tzinfo=UTC)
    base: dict[str, Any] = dict(id=str(uuid.uuid4()), name=None, owner="o", status="queued", spec=spec, created_at=now)
    return Job(**(base | dict(step=0, max_steps=50, world_size=1, attempt=0) | fields))


def test_a_valid_stored_spec_is_the_jobspec_it_was_stored_from() -> None:
    stored = JobSpec.model_validate(VALID_SPEC).model_dump(mode="json")
    spec = StoredSpecs().get("a", stored)
    assert spec == JobSpec.model_validate(VALID_SPEC)


def test_each_job_is_validated_once_while_its_spec_is_unchanged(validations: list[str]) -> None:
    specs = StoredSpecs()
    first = specs.get("a", copy.deepcopy(VALID_SPEC))
    assert specs.get("a", copy.deepcopy(VALID_SPEC)) is first  # an equal dict read again: the cached model
    assert validations == ["a"]
    changed = specs.get("a", {**VALID_SPEC, "max_steps": 7})  # a rewritten row (or a reused id) is read again
    assert changed is not None and changed.max_steps == 7 and validations == ["a", "a"]


def test_the_cache_is_bounded_and_keeps_the_recently_used(validations: list[str]) -> None:
    specs = StoredSpecs(size=2)
    for job_id in ("a", "b", "a", "c"):  # "a" used again: "b" is the least recently used when "c" comes
        specs.get(job_id, VALID_SPEC)
    assert len(specs) == 2 and validations == ["a", "b", "c"]
    specs.get("a", VALID_SPEC)
    specs.get("b", VALID_SPEC)
    assert validations == ["a", "b", "c", "b"]


def test_a_stored_spec_that_no_longer_validates_is_none_logged_once(
    validations: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    stored = copy.deepcopy(STALE_SPEC)
    specs = StoredSpecs()
    with caplog.at_level(logging.WARNING, logger=stored_specs.__name__):
        assert specs.get("old", stored) is None
        assert specs.get("old", stored) is None
    assert validations == ["old"]  # the failure is cached too: one warning, not one per poll
    [warning] = caplog.records
    assert "job old" in warning.getMessage() and "model" in warning.getMessage()
    assert stored == STALE_SPEC  # nothing stored is changed


def test_the_resource_derives_nodes_precision_and_scaling_from_the_typed_spec() -> None:
    stored = {**VALID_SPEC, "nodes": 2, "loss_scale": {"mode": "static", "static_scale": 8.0}}
    resource = job_public(_job(stored))
    assert (resource.nodes, resource.effective_precision, resource.loss_scaling) == (2, "fp16", "static")
    switched = job_public(_job(stored, precision_switches=[SWITCH]))
    assert (switched.effective_precision, switched.loss_scaling) == ("bf16", "static")  # the spec's scaling stays


def test_the_resource_serves_the_spec_as_stored_without_the_models_defaults() -> None:
    stored = {"model": {"name": "mlp"}, "dataset": {"name": "digits"}, "precision": "fp16"}  # an older, shorter dump
    resource = job_public(_job(copy.deepcopy(stored)))
    assert resource.model_dump(mode="json")["spec"] == stored
    assert (resource.nodes, resource.effective_precision, resource.loss_scaling) == (1, "fp16", "dynamic")


def test_a_stale_spec_gives_the_resources_defaults_and_is_served_as_stored() -> None:
    resource = job_public(_job(copy.deepcopy(STALE_SPEC)))
    assert resource.spec == STALE_SPEC
    assert (resource.nodes, resource.effective_precision, resource.loss_scaling) == (1, "fp32", "none")
    assert job_public(_job(copy.deepcopy(STALE_SPEC), precision_switches=[SWITCH])).effective_precision == "bf16"


def test_the_api_answers_a_job_whose_stored_spec_no_longer_validates(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    job = _job(copy.deepcopy(STALE_SPEC), owner=None)
    with sessions() as session:
        session.add(job)
        session.commit()
    shown = client.get(f"/jobs/{job.id}")
    assert shown.status_code == 200 and shown.json()["spec"] == STALE_SPEC
    listed = client.get("/jobs")
    assert listed.status_code == 200 and [j["spec"] for j in listed.json()["jobs"] if j["id"] == job.id] == [STALE_SPEC]


def test_the_gang_s_reads_of_nodes_and_gpus_are_the_validated_spec_s() -> None:
    """What forms a gang (``halfcast.core.db.members``) reads ``nodes`` and ``gpus`` from the validated spec: its
    defaults where the stored dict leaves them out, nothing derived from a spec that no longer validates."""
    job_id = str(uuid.uuid4())
    assert (spec_nodes(job_id, VALID_SPEC), spec_gpus(job_id, VALID_SPEC)) == (1, 0)
    gang = {**VALID_SPEC, "nodes": 3}
    assert spec_nodes(str(uuid.uuid4()), gang) == 3
    stale = str(uuid.uuid4())
    assert (spec_nodes(stale, STALE_SPEC), spec_gpus(stale, STALE_SPEC)) == (1, 0)  # it says nodes 2: not trusted
