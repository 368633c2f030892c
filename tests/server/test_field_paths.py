"""Every 422 item names its ``field``: the ``loc`` inside its source without pydantic's union tags.

server/http/field_paths.py computes it.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from halfcast.contracts.spec import JobSpec
from server.http.field_paths import field_path

SPEC: dict[str, Any] = {
    "model": {"name": "mlp", "config": {"hidden_sizes": [8]}},
    "dataset": {"name": "synthetic", "config": {"task": "regression"}},
    "micro_batch_size": 4,
    "max_steps": 5,
}


def _errors(client: TestClient, **overrides: Any) -> list[dict[str, Any]]:
    response = client.post("/jobs", json={**SPEC, **overrides})
    assert response.status_code == 422, response.text
    detail: list[dict[str, Any]] = response.json()["detail"]
    return detail


def test_a_bad_field_of_a_union_member_is_named_without_the_members_tag(client: TestClient) -> None:
    [error] = _errors(client, model={"name": "mlp", "config": {"hiden_sizes": [8]}})
    assert error["loc"] == ["body", "model", "mlp", "config", "hiden_sizes"]  # FastAPI's loc is kept as it was
    assert error["field"] == ["model", "config", "hiden_sizes"]
    [error] = _errors(client, dataset={"name": "synthetic", "config": {"task": "regression", "num_samples": "many"}})
    assert error["field"] == ["dataset", "config", "num_samples"]
    [error] = _errors(client, model={"name": "mlp", "config": {"hidden_sizes": [8, "wide"]}})
    assert error["field"] == ["model", "config", "hidden_sizes", 1]


def test_fields_outside_unions_an_unknown_tag_and_other_sources_keep_their_path(client: TestClient) -> None:
    [error] = _errors(client, micro_batch_size=0)
    assert error["field"] == ["micro_batch_size"]
    [error] = _errors(client, bogus_field=1)
    assert error["field"] == ["bogus_field"]
    [error] = _errors(client, model={"name": "mlpx"})  # union_tag_invalid: the union itself
    assert error["field"] == ["model"]
    response = client.get("/jobs", params={"limit": 0})
    assert response.status_code == 422
    assert [item["field"] for item in response.json()["detail"]] == [["limit"]]
    response = client.post("/jobs", content=b'{"seed": NaN}', headers={"content-type": "application/json"})
    assert [item["field"] for item in response.json()["detail"]] == [["seed"]]


def test_the_openapi_description_names_the_field_of_a_422_item(client: TestClient) -> None:
    item = client.get("/openapi.json").json()["components"]["schemas"]["ValidationError"]
    assert item["properties"]["field"]["type"] == "array"


@pytest.mark.parametrize(
    ("loc", "field"),
    [
        (("adapter", "target_modules", "list[constrained-str]", 0), ("adapter", "target_modules", 0)),
        (("adapter", "target_modules", "literal['all-linear']"), ("adapter", "target_modules")),
        (("model", "gpt", "config", "n_layer"), ("model", "config", "n_layer")),
        (("early_stopping", "metric"), ("early_stopping", "metric")),
        (("model", "mlp", "config", "unknown", "deeper"), ("model", "config", "unknown", "deeper")),
        ((), ()),
    ],
)
def test_field_path_drops_tagged_and_plain_union_labels_only(
    loc: tuple[str | int, ...], field: tuple[str | int, ...]
) -> None:
    assert field_path(JobSpec.__pydantic_core_schema__, loc) == field
