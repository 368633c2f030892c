"""The job resource's ``loss_scaling``: how the spec's precision scales its loss (dynamic, static, none)."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest
from api_support import VALID_SPEC
from fastapi.testclient import TestClient

from halfcast.contracts.spec import JobSpec
from halfcast.core.db.stored_spec import stored_spec
from server.schemas import loss_scaling


def _spec(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(VALID_SPEC)
    spec.update(changes)
    return {key: value for key, value in spec.items() if value is not None}


SPECS = {
    "dynamic": _spec(precision="fp16", loss_scale=None),
    "static": _spec(precision="fp16", loss_scale={"mode": "static", "static_scale": 1024.0}),
    "none (bf16)": _spec(precision="bf16", loss_scale=None),
    "none (fp32)": _spec(precision="fp32", loss_scale=None),
}


@pytest.mark.parametrize("label", list(SPECS))
def test_the_resource_says_how_the_job_scales_its_loss(client: TestClient, label: str) -> None:
    job = client.post("/jobs", json=SPECS[label]).json()
    assert job["loss_scaling"] == label.split(" ")[0]
    assert client.get(f"/jobs/{job['id']}").json()["loss_scaling"] == job["loss_scaling"]


@pytest.mark.parametrize(
    "spec", [*SPECS.values(), _spec(precision="fp8", loss_scale=None, gpus=1)], ids=[*SPECS, "fp8"]
)
def test_loss_scaling_agrees_with_the_trainers_effective_loss_scale(spec: dict[str, Any]) -> None:
    """The resource reads the stored spec validated; the trainer builds its scaler from ``effective_loss_scale``
    (a no-op when None)."""
    validated = JobSpec.model_validate(spec)
    effective = validated.effective_loss_scale
    stored = validated.model_dump(mode="json")
    assert loss_scaling(stored_spec(str(uuid.uuid4()), stored)) == ("none" if effective is None else effective.mode)
