"""Regression tests for the input-hardening gaps the API fuzzer (``test_fuzz_api.py``) and its probes found.

Each test names the bug it pins: before the fix the request answered 500 (or a bare
400, or a 422 to a caller without a token), or the spec accepted an unbounded value.
Tests taking ``client`` run on SQLite and PostgreSQL (``database_url``).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from api_support import VALID_SPEC, FakeQueue, count_rows, insert_job, insert_steps
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from halfcast.common.strict_json import NONFINITE_MESSAGE, loads_strict
from halfcast.contracts.spec import JobSpec
from halfcast.core.db.models import AuditEvent
from halfcast.core.settings import Settings
from server.app import create_app
from server.http import openapi_errors
from server.http.body_errors import AsciiJSONResponse, install_body_error_handlers
from server.http.strict_body import StrictJSONRoute

JSON = {"content-type": "application/json"}


def _anonymous(client: TestClient) -> TestClient:
    """A client of the same (started) app that sends no token."""
    return TestClient(client.app, raise_server_exceptions=False)


def _only_error(response: Any, status_code: int) -> dict[str, Any]:
    assert response.status_code == status_code, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, list) and len(detail) == 1, detail
    return dict(detail[0])


# ----------------------------------------------------------------------------- bodies that are not JSON


@pytest.mark.parametrize(
    "body",
    [b'{"name": "\xff"}', b"[" * 50_000 + b"]" * 50_000, b'{"seed": ' + b"9" * 5000 + b"}"],
    ids=["not-utf8", "nested-too-deep", "int-beyond-4300-digits"],
)
def test_unreadable_body_is_422_at_body(client: TestClient, sessions: sessionmaker[Session], body: bytes) -> None:
    """Was a bare ``400 "There was an error parsing the body"``: now a 422 at ``["body"]`` saying why."""
    error = _only_error(client.post("/jobs", content=body, headers=JSON), 422)
    assert error["loc"] == ["body"] and error["type"] == "json_invalid"
    assert error["msg"].startswith("the body is not JSON: ")
    assert count_rows(sessions) == 0


@pytest.mark.parametrize("body", [b"{", b"\xff\xfe"], ids=["malformed-json", "not-utf8"])
def test_unparseable_body_without_token_is_401(client: TestClient, body: bytes) -> None:
    """FastAPI parses the body before the auth dependency runs: a caller without a token got the 422 (or 400)."""
    response = _anonymous(client).post("/jobs", content=body, headers=JSON)
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert "authentication required" in response.json()["detail"]


def test_unparseable_body_with_bad_token_is_401(client: TestClient) -> None:
    """A revoked or made-up token gets 401 first, however bad the body."""
    response = _anonymous(client).post("/jobs", content=b"{", headers={**JSON, "Authorization": "Bearer hc_nope"})
    assert response.status_code == 401, response.text


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (b'{"model":{"name":"mlp"},"dataset":{"name":"digits"},"name":"\\ud800"}', ["body", "name"]),
        (b'{"model":{"name":"mlp"},"dataset":{"name":"digits"},"resume_from":"x\\udfff"}', ["body", "resume_from"]),
        (b'{"model":{"name":"mlp"},"dataset":{"name":"digits"},"\\ud800":1}', ["body"]),
    ],
    ids=["name", "resume_from", "unknown-field"],
)
def test_lone_surrogate_is_422_not_500(
    client: TestClient, sessions: sessionmaker[Session], body: bytes, loc: list[str]
) -> None:
    """A lone UTF-16 surrogate is valid JSON text but not UTF-8: echoing it in the 422 crashed the response (500)."""
    response = client.post("/jobs", content=body, headers=JSON)
    assert response.status_code == 422, response.text
    assert json.loads(response.content)["detail"][0]["loc"] == loc
    assert count_rows(sessions) == 0


# ----------------------------------------------------------------------------- non-finite numbers (issue 11)

#: What Python's JSON parser accepts but JSON has not: each answered 500 (the 422 echoing it could not render).
NONFINITE = ["NaN", "Infinity", "-Infinity", "1e309", "-1e309"]
#: A field of each kind, and the raw text of a valid spec holding ``@`` there.
_SPEC_WITH_HOLE = {
    ("max_grad_norm",): '{"model":{"name":"mlp"},"dataset":{"name":"digits"},"max_grad_norm":@}',
    ("micro_batch_size",): '{"model":{"name":"mlp"},"dataset":{"name":"digits"},"micro_batch_size":@}',
    ("loss_scale", "init_scale"): '{"model":{"name":"mlp"},"dataset":{"name":"digits"},"precision":"fp16",'
    '"loss_scale":{"mode":"dynamic","init_scale":@}}',
    (
        "model",
        "config",
        "hidden_sizes",
        1,
    ): '{"model":{"name":"mlp","config":{"hidden_sizes":[64,@]}},"dataset":{"name":"digits"}}',
    ("name",): '{"model":{"name":"mlp"},"dataset":{"name":"digits"},"name":@}',
}


def _job_creations(sessions: sessionmaker[Session]) -> int:
    with sessions() as session:
        return (
            session.scalar(select(func.count()).select_from(AuditEvent).where(AuditEvent.action == "job.create")) or 0
        )


@pytest.mark.parametrize("literal", NONFINITE)
@pytest.mark.parametrize("path", list(_SPEC_WITH_HOLE), ids=[".".join(map(str, p)) for p in _SPEC_WITH_HOLE])
def test_nonfinite_number_in_a_spec_is_422_at_its_field_and_stores_nothing(
    client: TestClient, sessions: sessionmaker[Session], fake_queue: FakeQueue, path: tuple[Any, ...], literal: str
) -> None:
    """Was a 500 (or a dropped connection): the body is not JSON, so a 422 naming the field; no row, no audit, no message."""
    response = client.post("/jobs", content=_SPEC_WITH_HOLE[path].replace("@", literal), headers=JSON)
    error = _only_error(response, 422)
    assert error == {
        "type": "json_invalid",
        "loc": ["body", *path],
        "msg": NONFINITE_MESSAGE,
        "input": literal,
        "field": [*path],
    }
    assert (count_rows(sessions), _job_creations(sessions), fake_queue.sent) == (0, 0, [])


def test_every_nonfinite_number_is_named_in_document_order(client: TestClient) -> None:
    body = '{"model":{"name":"mlp"},"dataset":{"name":"digits"},"seed":NaN,"optimizer":{"lr":1e400,"eps":-Infinity}}'
    detail = client.post("/jobs", content=body, headers=JSON).json()["detail"]
    assert [(d["loc"], d["input"]) for d in detail] == [
        (["body", "seed"], "NaN"), (["body", "optimizer", "lr"], "1e400"), (["body", "optimizer", "eps"], "-Infinity")
    ]  # fmt: skip  # a table, laid out by hand


@pytest.mark.parametrize(
    "body", ['{"seed": NaN, "seed": 1}', "NaN", "[Infinity]"], ids=["replaced-by-duplicate-key", "root", "in-a-list"]
)
def test_a_nonfinite_number_anywhere_is_422_even_where_no_field_holds_it(
    client: TestClient, sessions: sessionmaker[Session], body: str
) -> None:
    """Strict means the whole text: a NaN that a later duplicate key replaced is refused too (at ``["body"]``)."""
    detail = client.post("/jobs", content=body, headers=JSON).json()["detail"]
    assert detail and all(item["msg"] == NONFINITE_MESSAGE and item["loc"][0] == "body" for item in detail), detail
    assert count_rows(sessions) == 0


def test_a_nonfinite_body_without_token_is_401(client: TestClient) -> None:
    """Like any body that is not JSON: the caller without a token learns nothing about it."""
    response = _anonymous(client).post("/jobs", content='{"seed": NaN}', headers=JSON)
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"


def test_every_route_with_a_body_parses_it_as_strict_json() -> None:
    """A body route on a router without ``route_class=StrictJSONRoute`` would take NaN again."""
    with_body = _body_routes(create_app(Settings(auth=True)))
    assert ("POST", "/jobs") in {(method, path) for method, path, _ in with_body}, with_body
    lenient = [(method, path) for method, path, strict in with_body if not strict]
    assert lenient == [], f"these routes parse bodies with Python's lenient JSON: {lenient}"


def _body_routes(app: FastAPI) -> list[tuple[str, str, bool]]:
    """``(method, path, parsed strictly)`` of every API route that takes a body."""
    found = []
    for context in _route_contexts(app):
        route = getattr(context, "original_route", context)
        if isinstance(route, APIRoute) and route.body_field is not None:
            found += [
                (method, context.path, isinstance(route, StrictJSONRoute)) for method in sorted(route.methods or ())
            ]
    return found


def _route_contexts(app: FastAPI) -> list[Any]:
    """The app's routes, included routers' ones too (FastAPI 0.165 keeps those nested)."""
    found: list[Any] = []
    for route in app.routes:
        found += route.effective_route_contexts() if hasattr(route, "effective_route_contexts") else [route]
    return found


class _FiniteBody(BaseModel):
    x: float = Field(le=10.0, allow_inf_nan=False)


def _lenient_app() -> FastAPI:
    """An app with Halfcast's 422 handlers but a route parsing with Python's lenient JSON, and one raising ``ctx: inf``."""
    app = FastAPI()
    install_body_error_handlers(app)

    @app.post("/lenient")
    def lenient(body: _FiniteBody) -> float:
        return body.x

    @app.get("/ctx")
    def ctx() -> None:
        raise RequestValidationError(
            [
                {
                    "type": "less_than",
                    "loc": ("query", "x"),
                    "msg": "m",
                    "input": float("nan"),
                    "ctx": {"lt": float("inf")},
                }
            ]
        )

    return app


def test_a_422_holding_a_nonfinite_float_renders_it_as_a_string() -> None:
    """Defence in depth: a 422 echoing NaN (``input``) or holding inf (``ctx``) rendered as a 500; now strict JSON."""
    with TestClient(_lenient_app(), raise_server_exceptions=False) as client:
        echoed = client.post("/lenient", content='{"x": NaN}', headers=JSON)
        raised = client.get("/ctx")
    assert echoed.status_code == 422 and loads_strict(echoed.content)["detail"][0]["input"] == "NaN"
    assert raised.status_code == 422 and loads_strict(raised.content)["detail"][0]["ctx"] == {"lt": "Infinity"}


def test_ascii_json_response_writes_nonfinite_floats_as_their_names() -> None:
    body = AsciiJSONResponse({"a": [float("nan"), float("inf"), -float("inf"), 1.5], "b": "\ud800"}).body
    assert loads_strict(bytes(body)) == {"a": ["NaN", "Infinity", "-Infinity", 1.5], "b": "\ud800"}


# ----------------------------------------------------------------------------- ids, cursors and step numbers


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", ""), ("GET", "/metrics"), ("POST", "/cancel"), ("GET", "/events"), ("GET", "/logs")],
)
def test_job_id_with_nul_is_404(client: TestClient, method: str, path: str) -> None:
    """PostgreSQL cannot compare text with a NUL character: ``/jobs/a%00b`` answered 500 there."""
    response = client.request(method, f"/jobs/a%00b{path}")
    assert response.status_code == 404, response.text
    assert response.json()["job_id"] == "a\x00b"


def test_cursor_naming_a_job_id_with_nul_is_422(client: TestClient) -> None:
    """A forged cursor whose job id holds NUL reached the query (500 on PostgreSQL)."""
    raw = json.dumps(["2030-01-01T00:00:00+00:00", "a\x00b"]).encode()
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    error = _only_error(client.get("/jobs", params={"cursor": cursor}), 422)
    assert error["loc"] == ["query", "cursor"]


@pytest.mark.parametrize("route", ["metrics", "events"])
@pytest.mark.parametrize("after_step", [2**63, 2**70])
def test_after_step_beyond_64_bits_is_422(
    client: TestClient, sessions: sessionmaker[Session], route: str, after_step: int
) -> None:
    """``step_records.step`` is a 64-bit integer: a larger ``after_step`` crashed the query (500 / broken stream)."""
    job_id = insert_job(sessions, status="succeeded")
    insert_steps(sessions, job_id, range(1, 3))
    error = _only_error(client.get(f"/jobs/{job_id}/{route}", params={"after_step": after_step}), 422)
    assert error["loc"] == ["query", "after_step"]


def test_largest_after_step_still_pages(client: TestClient, sessions: sessionmaker[Session]) -> None:
    """The bound is the column's range: ``2**63 - 1`` is accepted (an empty page)."""
    job_id = insert_job(sessions, status="succeeded")
    response = client.get(f"/jobs/{job_id}/metrics", params={"after_step": 2**63 - 1})
    assert response.status_code == 200 and response.json()["points"] == []


@pytest.mark.parametrize("cursor", ["²", "١٢"])
def test_audit_cursor_of_non_ascii_digits_is_422(client: TestClient, cursor: str) -> None:
    """``"²".isdigit()`` is true but ``int("²")`` raises: the audit cursor check let it through (500)."""
    error = _only_error(client.get("/audit", params={"cursor": cursor}), 422)
    assert error["loc"] == ["query", "cursor"]


# ----------------------------------------------------------------------------- OpenAPI declarations


def test_openapi_declares_auth_body_and_database_errors(client: TestClient) -> None:
    """Every status the API sends is declared: 401/503 on token routes, 403 on admin ones, 413 with a body."""
    paths = client.get("/openapi.json").json()["paths"]
    submit = paths["/jobs"]["post"]["responses"]
    assert {"401", "413", "503", "422", "201"} <= set(submit)
    assert "403" in paths["/audit"]["get"]["responses"]
    assert "403" not in paths["/jobs/{job_id}"]["get"]["responses"]
    assert {"401", "503"} <= set(paths["/jobs/{job_id}/events"]["get"]["responses"])
    assert "401" not in paths["/healthz"]["get"]["responses"]
    assert "413" not in paths["/jobs"]["get"]["responses"]


def test_every_route_that_takes_a_token_declares_401_and_503(client: TestClient) -> None:
    """On every route but the public ones, included routers' routes too."""
    paths = client.get("/openapi.json").json()["paths"]
    public = {"/healthz", "/readyz", "/", "/docs", "/docs/oauth2-redirect", "/redoc"}
    undeclared = [
        f"{method.upper()} {path}"
        for path, methods in paths.items()
        if path not in public
        for method, operation in methods.items()
        if not {"401", "503"} <= set(operation["responses"])
    ]
    assert undeclared == []


def test_the_error_declarations_wait_for_the_openapi_description(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding each route's dependencies at creation made FastAPI build every route's request model at once (55 ms
    an app, 5 ms without; every API process and API test makes one): it happens once, with the description."""
    calls: list[FastAPI] = []
    declare = openapi_errors._add_error_responses

    def counted(app: FastAPI) -> None:
        calls.append(app)
        declare(app)

    monkeypatch.setattr(openapi_errors, "_add_error_responses", counted)
    app = create_app(Settings(data_dir=Path("/nonexistent"), broker_url=None))
    assert calls == []
    schema = app.openapi()
    assert calls == [app] and "401" in schema["paths"]["/jobs"]["get"]["responses"]
    assert app.openapi() is schema and calls == [app]


# ----------------------------------------------------------------------------- spec bounds (item 4)

_BASE = {"model": {"name": "mlp"}, "dataset": {"name": "digits"}}


@pytest.mark.parametrize(
    ("patch", "loc"),
    [
        ({"checkpoint_interval": 10**8 + 1}, ("checkpoint_interval",)),
        ({"eval_interval": 2**70}, ("eval_interval",)),
        ({"max_grad_norm": 1e308}, ("max_grad_norm",)),
        ({"resume_from": "runs/a\x00b"}, ("resume_from",)),
        ({"resume_from": "line\nbreak"}, ("resume_from",)),
        ({"faults": {"kill_at_step": {"step": 10**9}}}, ("faults", "kill_at_step", "step")),
        ({"faults": {"kill_at_step": {"step": 1, "rank": 1024}}}, ("faults", "kill_at_step", "rank")),
        ({"faults": {"nonfinite_grad_steps": [2**64]}}, ("faults", "nonfinite_grad_steps", 0)),
        ({"faults": {"ranks": [5000]}}, ("faults", "ranks", 0)),
        ({"faults": {"raise_at_step": 10**9}}, ("faults", "raise_at_step")),
        (
            {"dataset": {"name": "digits", "config": {"split_seed": 2**32}}},
            ("dataset", "digits", "config", "split_seed"),
        ),
        ({"dataset": {"name": "synthetic", "config": {"seed": 2**63}}}, ("dataset", "synthetic", "config", "seed")),
    ],
)
def test_spec_rejects_out_of_range_values(patch: dict[str, Any], loc: tuple[Any, ...]) -> None:
    """Values that were unbounded (or unprintable) are rejected at the field that holds them."""
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate({**_BASE, **patch})
    assert loc in [tuple(error["loc"]) for error in caught.value.errors()]


def test_text_path_must_be_printable() -> None:
    """A NUL in a data path would crash the worker's ``open()``; it is refused at submission."""
    spec = {"model": {"name": "gpt"}, "dataset": {"name": "text", "config": {"source": "file", "path": "a\x00b"}}}
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate(spec)
    assert caught.value.errors()[0]["loc"][-1] == "path"


def _unbounded(name: str, node: dict[str, Any]) -> list[str]:
    """Why the JSON-schema ``node`` at ``name`` is unbounded (empty when it is bounded)."""
    kind = node.get("type")
    if "enum" in node or "const" in node:
        return []
    if kind == "string" and "maxLength" not in node:
        return [f"{name}: string without maxLength"]
    if kind == "array" and "maxItems" not in node and "prefixItems" not in node:
        return [f"{name}: array without maxItems"]
    if kind in ("integer", "number"):
        low = "minimum" in node or "exclusiveMinimum" in node
        high = "maximum" in node or "exclusiveMaximum" in node
        return [] if low and high else [f"{name}: {kind} without a range"]
    return []


def _walk(name: str, node: Any, defs: dict[str, Any], seen: set[str]) -> list[str]:
    if isinstance(node, list):
        return [problem for index, item in enumerate(node) for problem in _walk(name, item, defs, seen)]
    if not isinstance(node, dict):
        return []
    if "$ref" in node:
        ref = node["$ref"].rsplit("/", 1)[-1]
        return [] if ref in seen else _walk(ref, defs[ref], defs, seen | {ref})
    problems = _unbounded(name, node)
    for key, child in node.items():
        if key == "properties":
            problems += [p for field, sub in child.items() for p in _walk(f"{name}.{field}", sub, defs, seen)]
        elif key in ("items", "prefixItems", "anyOf", "oneOf", "allOf"):
            problems += _walk(f"{name}[]", child, defs, seen)
    return problems


def test_every_spec_field_is_bounded() -> None:
    """Every string and list of the job spec has a length bound and every number a range (issue 6, item 4)."""
    schema = JobSpec.model_json_schema()
    assert _walk("JobSpec", schema, schema.get("$defs", {}), set()) == []


def test_valid_spec_still_accepted() -> None:
    """The bounds leave the documented example alone."""
    JobSpec.model_validate(VALID_SPEC)
