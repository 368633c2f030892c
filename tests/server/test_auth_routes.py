"""Every route × every kind of caller: no token and a revoked token get 401, another owner 404 (403 for admin routes).

Registered datasets and models (``registered`` routes) are isolated like jobs: ``bob`` gets the 404 of a
missing one for alice's dataset or model and deletes nothing.

The routes come from the app itself, ``HEAD`` ones included, so a route added without
deciding its access fails here (add it to ``CASES`` or, for a public one, to
``PUBLIC``). Each job route is asked about one job owned by ``alice``: ``bob`` gets
exactly the answer of a missing job and changes nothing, ``alice`` and an admin get a
2xx. ``cookie`` is ``alice`` with the dashboard's session cookie instead of the header:
on ``GET`` and ``HEAD`` she gets what ``alice`` gets, on any other method a 401.
"""

from __future__ import annotations

import io
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from api_support import VALID_SPEC, FakeQueue, insert_job, make_token
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from starlette.routing import Mount, Route

from halfcast.core.db.models import Job, RegisteredDataset, RegisteredModel, utcnow
from halfcast.core.db.tokens import revoke_token
from halfcast.core.settings import Settings
from server.app import create_app
from server.auth import SESSION_COOKIE

#: Methods the session cookie authenticates (docs/api.md, "Authentication"): reads only, never a change.
COOKIE_READS = frozenset({"GET", "HEAD"})
#: Routes answered without a token: probes, the dashboard page, the OpenAPI description (Starlette adds its HEAD).
PUBLIC = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/"),
    ("GET", "/openapi.json"),
    ("HEAD", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
}


@dataclass(frozen=True)
class Case:
    """How one route is called, and who may: ``job`` (owner or admin), ``admin`` (admins), ``any`` (any token)."""

    access: str
    json: dict[str, Any] | None = None
    job_status: str = "succeeded"
    params: dict[str, Any] = field(default_factory=dict)
    #: Other path parameters, e.g. ``{"name": "final.pt"}``.
    path_params: dict[str, str] = field(default_factory=dict)
    #: The job has a ``final.pt`` checkpoint in attempt 1 (for the checkpoint routes).
    checkpoint: bool = False
    #: The job has an ``adapter`` export in attempt 1 (for the export routes).
    export: bool = False
    #: The job has a ``model`` export in attempt 1 (for registering it).
    model_export: bool = False
    #: A raw request body and its content type (uploads), instead of ``json``.
    content: bytes | None = None
    content_type: str | None = None


#: An upload's body: a dataset of two text rows, and a model directory as a tar.
DATASET_ROWS = b'{"text": "a"}\n{"text": "b"}\n'
MODEL_FILES = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"\x08\0\0\0\0\0\0\0{}      "}


def _model_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in MODEL_FILES.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


CASES: dict[tuple[str, str], Case] = {
    ("POST", "/jobs"): Case("any", json=VALID_SPEC),
    ("GET", "/jobs"): Case("any"),
    ("GET", "/jobs/{job_id}"): Case("job"),
    ("GET", "/jobs/{job_id}/metrics"): Case("job"),
    ("GET", "/jobs/{job_id}/evals"): Case("job"),
    ("POST", "/jobs/{job_id}/cancel"): Case("job", job_status="running"),
    ("GET", "/jobs/{job_id}/events"): Case("job"),
    ("GET", "/jobs/{job_id}/logs"): Case("job", params={"tail": 5}),
    ("GET", "/jobs/{job_id}/checkpoints"): Case("job", checkpoint=True),
    ("GET", "/jobs/{job_id}/checkpoints/{name}"): Case("job", path_params={"name": "final.pt"}, checkpoint=True),
    ("GET", "/jobs/{job_id}/exports"): Case("job", export=True),
    ("GET", "/jobs/{job_id}/exports/{kind}"): Case("job", path_params={"kind": "adapter"}, export=True),
    ("HEAD", "/jobs/{job_id}/checkpoints/{name}"): Case("job", path_params={"name": "final.pt"}, checkpoint=True),
    ("HEAD", "/jobs/{job_id}/exports/{kind}"): Case("job", path_params={"kind": "adapter"}, export=True),
    ("GET", "/workers"): Case("any"),
    ("GET", "/metrics"): Case("admin"),
    ("GET", "/audit"): Case("admin"),
    ("GET", "/session"): Case("any"),
    ("POST", "/session"): Case("any"),
    ("DELETE", "/session"): Case("any"),
    ("POST", "/datasets"): Case(
        "any", params={"format": "text"}, content=DATASET_ROWS, content_type="application/jsonl"
    ),
    ("GET", "/datasets"): Case("any"),
    ("GET", "/datasets/{dataset_id}"): Case("registered"),
    ("DELETE", "/datasets/{dataset_id}"): Case("registered"),
    ("POST", "/models"): Case("any", content=_model_tar(), content_type="application/x-tar"),
    ("GET", "/models"): Case("any"),
    ("GET", "/models/{model_id}"): Case("registered"),
    ("DELETE", "/models/{model_id}"): Case("registered"),
    ("POST", "/jobs/{job_id}/exports/model/register"): Case("job", model_export=True),
}


def _flatten(routes: list[Any]) -> Iterator[Any]:
    """Routes with a path and methods; FastAPI 0.165 wraps included routers (``effective_route_contexts``)."""
    for route in routes:
        if isinstance(route, Mount):
            continue  # the dashboard's static files
        if isinstance(route, (APIRoute, Route)):
            yield route
        elif hasattr(route, "effective_route_contexts"):
            yield from route.effective_route_contexts()
        else:
            raise AssertionError(f"unknown kind of route: {route!r}")


def app_routes() -> list[tuple[str, str]]:
    """Every (method, path) the app serves, HEAD included (mounted static files excluded)."""
    app = create_app(Settings(auth=True))
    found = {(method, route.path) for route in _flatten(app.routes) for method in (route.methods or ())}
    return sorted(found)


PROTECTED = [route for route in app_routes() if route not in PUBLIC]


@dataclass
class World:
    """A client (no default token), the tokens of every caller, and alice's job."""

    client: TestClient
    tokens: dict[str, str | None]
    job_id: str
    sessions: sessionmaker[Session]
    #: alice's registered dataset and model.
    registered: dict[str, str] = field(default_factory=dict)


def _register_for_alice(sessions: sessionmaker[Session]) -> dict[str, str]:
    """A dataset and a model row of ``alice`` (their files are not needed to read or delete them)."""
    ids = {"dataset_id": str(uuid.uuid4()), "model_id": str(uuid.uuid4())}
    with sessions() as session:
        session.add(
            RegisteredDataset(
                id=ids["dataset_id"],
                owner="alice",
                name="d",
                format="text",
                file_format="jsonl",
                rows=2,
                bytes=10,
                sha256="0" * 64,
                created_at=utcnow(),
            )
        )
        session.add(
            RegisteredModel(
                id=ids["model_id"],
                owner="alice",
                name="m",
                model_type="llama",
                files=2,
                bytes=10,
                sha256="0" * 64,
                created_at=utcnow(),
            )
        )
        session.commit()
    return ids


@pytest.fixture
def world(
    settings: Settings, database_url: str, sessions: sessionmaker[Session], request: pytest.FixtureRequest
) -> Iterator[World]:
    method, path = request.node.callspec.params["route"]
    case = CASES.get((method, path))
    job_id = insert_job(sessions, status=case.job_status if case else "succeeded", owner="alice")
    tokens: dict[str, str | None] = {
        "none": None,
        "owner": make_token(database_url, "alice"),
        "other": make_token(database_url, "bob"),
        "admin": make_token(database_url, "root", admin=True),
        "revoked": make_token(database_url, "alice"),
    }
    with sessions() as session:
        revoke_token(session, 4, actor="cli:test")  # the fourth token made: alice's second
    if case is not None and case.checkpoint:
        folder = settings.runs_dir / job_id / "attempt-1" / "checkpoints"
        folder.mkdir(parents=True)
        (folder / "final.pt").write_bytes(b"weights")
    if case is not None and case.export:
        folder = settings.runs_dir / job_id / "attempt-1" / "export" / "adapter"
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_bytes(b"{}")
    if case is not None and case.model_export:
        folder = settings.runs_dir / job_id / "attempt-1" / "export" / "model"
        folder.mkdir(parents=True)
        for name, data in MODEL_FILES.items():
            (folder / name).write_bytes(data)
    with TestClient(create_app(settings, FakeQueue())) as client:
        yield World(client, tokens, job_id, sessions, _register_for_alice(sessions))


def _credentials(world: World, caller: str) -> dict[str, str]:
    """The headers ``caller`` sends: a bearer token, alice's session cookie (``cookie``), or nothing."""
    if caller == "cookie":
        return {"Cookie": f"{SESSION_COOKIE}={world.tokens['owner']}"}
    token = world.tokens[caller]
    return {"Authorization": f"Bearer {token}"} if token else {}


def _call(
    world: World, method: str, path: str, caller: str, job_id: str | None = None, item_id: str | None = None
) -> Any:
    case = CASES[(method, path)]
    headers = _credentials(world, caller)
    url = path.replace("{job_id}", job_id or world.job_id)
    for name, value in {**world.registered, **case.path_params}.items():
        url = url.replace("{" + name + "}", item_id if item_id is not None and name in world.registered else value)
    if case.content is not None:
        headers["content-type"] = case.content_type or ""
        return world.client.request(method, url, headers=headers, content=case.content, params=case.params)
    return world.client.request(method, url, headers=headers, json=case.json, params=case.params)


def _status_of(world: World) -> str:
    with world.sessions() as session:
        job = session.get(Job, world.job_id)
        assert job is not None
        return job.status


def test_every_route_is_classified() -> None:
    unclassified = sorted(set(PROTECTED) - set(CASES))
    assert not unclassified, f"decide who may call these routes (CASES or PUBLIC): {unclassified}"
    assert sorted(set(CASES) - set(PROTECTED)) == [], "CASES names routes the app no longer has"


@pytest.mark.parametrize("caller", ["none", "revoked", "other", "owner", "admin", "cookie"])
@pytest.mark.parametrize("route", PROTECTED, ids=[f"{m} {p}" for m, p in PROTECTED])
def test_route_access(world: World, route: tuple[str, str], caller: str) -> None:
    method, path = route
    assert route in CASES, f"{method} {path}: decide who may call it (CASES or PUBLIC)"
    case = CASES[route]
    response = _call(world, method, path, caller)
    has_body = method != "HEAD"

    if caller in ("none", "revoked") or (caller == "cookie" and method not in COOKIE_READS):
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"] == "Bearer"
        assert not has_body or isinstance(response.json()["detail"], str)
    elif case.access == "admin" and caller != "admin":
        assert response.status_code == 403, response.text
    elif case.access == "job" and caller == "other":
        missing = _call(world, method, path, caller, job_id=(missing_id := str(uuid.uuid4())))
        assert response.status_code == missing.status_code == 404, response.text
        if has_body:
            assert response.json() == {
                **missing.json(),
                "job_id": world.job_id,
                "detail": missing.json()["detail"].replace(missing_id, world.job_id),
            }
        assert _status_of(world) == case.job_status  # nothing changed
    elif case.access == "registered" and caller == "other":
        missing = _call(world, method, path, caller, item_id=(missing_id := str(uuid.uuid4())))
        assert response.status_code == missing.status_code == 404, response.text
        present = next(value for value in world.registered.values() if value in response.json()["detail"])
        assert response.json() == {"detail": missing.json()["detail"].replace(missing_id, present)}
        assert _call(world, "GET", path, "admin").status_code == 200  # nothing deleted
    else:
        assert 200 <= response.status_code < 300, response.text
    if (method, path) == ("GET", "/jobs") and response.status_code == 200:
        listed = [job["id"] for job in response.json()["jobs"]]
        assert listed == ([world.job_id] if caller in ("owner", "admin", "cookie") else [])


@pytest.mark.parametrize(
    "path", ["/healthz", "/", "/static/app.js", "/openapi.json", "/docs", "/redoc", "/docs/assets/swagger-ui-bundle.js"]
)
def test_public_paths_need_no_token(client: TestClient, path: str) -> None:
    response = client.get(path, headers={"Authorization": ""})
    assert response.status_code == 200, response.text
