"""Issue 24 item 7: JSON types are taken strictly at the API, and a body is UTF-8 JSON or it is refused.

``"max_steps": "5"`` and ``"max_steps": true`` were accepted (201; ``true`` trained 1 step). Runs on
SQLite and PostgreSQL (``client`` takes ``database_url``); nothing is stored for a refused body.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from api_support import VALID_SPEC, count_rows
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

JSON = {"content-type": "application/json"}


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    spec = json.loads(json.dumps(VALID_SPEC))
    target = spec
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value
    return spec


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("max_steps",), "5"),
        (("max_steps",), True),
        (("max_steps",), 5.0),
        (("micro_batch_size",), False),
        (("seed",), "0"),
        (("loss_scale", "init_scale"), "65536"),
        (("loss_scale", "init_scale"), True),
        (("name",), 5),
        (("name",), False),
        (("precision",), 16),
        (("keep_best",), 1),
        (("keep_best",), "true"),
    ],
    ids=lambda value: json.dumps(value) if not isinstance(value, tuple) else ".".join(value),
)
def test_a_value_of_the_wrong_json_type_is_a_422_at_its_field(
    client: TestClient, sessions: sessionmaker[Session], path: tuple[str, ...], value: Any
) -> None:
    response = client.post("/jobs", json=_with(path, value))
    assert response.status_code == 422, response.text
    locs = [error["loc"] for error in response.json()["detail"]]
    assert ["body", *path] in locs, locs
    assert count_rows(sessions) == 0


def test_an_integer_where_a_float_is_wanted_is_fine(client: TestClient) -> None:
    """JSON has one number type: ``1`` for ``optimizer.lr`` (a float) is a number all the same."""
    response = client.post("/jobs", json=_with(("optimizer",), {"name": "sgd", "lr": 1}))
    assert response.status_code == 201, response.text


@pytest.mark.parametrize("charset", ["utf-16", "UTF-16LE", "latin-1", "utf-32"])
def test_a_body_declaring_another_charset_is_a_415(
    client: TestClient, sessions: sessionmaker[Session], charset: str
) -> None:
    body = json.dumps(VALID_SPEC).encode(charset.lower().replace("latin-1", "latin_1"))
    response = client.post("/jobs", content=body, headers={"content-type": f"application/json; charset={charset}"})
    assert response.status_code == 415, response.text
    assert charset.lower() in response.json()["detail"]
    assert count_rows(sessions) == 0


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32", "utf-32-be"])
def test_a_body_that_is_not_utf8_is_never_decoded_by_guess(
    client: TestClient, sessions: sessionmaker[Session], encoding: str
) -> None:
    """Python's ``json.loads`` detects UTF-16 and UTF-32 in bytes; the API must not."""
    response = client.post("/jobs", content=json.dumps(VALID_SPEC).encode(encoding), headers=JSON)
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"][0] == "body" and error["type"] == "json_invalid", error
    assert count_rows(sessions) == 0


def test_utf8_declared_is_accepted(client: TestClient) -> None:
    headers = {"content-type": 'application/json; charset="UTF-8"'}
    assert client.post("/jobs", content=json.dumps(VALID_SPEC).encode(), headers=headers).status_code == 201


def test_a_wrongly_typed_body_without_a_token_is_a_401(client: TestClient) -> None:
    anonymous = TestClient(client.app, raise_server_exceptions=False)
    response = anonymous.post("/jobs", json=_with(("max_steps",), "5"))
    assert response.status_code == 401, response.text
