"""``GET /jobs/{id}``'s shortcut past FastAPI (:mod:`server.routes.job_poll`) answers the bytes FastAPI's route answers.

The same requests go to an app with the shortcut and to one without it (its middleware
taken out before the app starts); status, every header in order and the body must be
equal, for 200, 304, each kind of 401, 404, a cookie instead of the header, and on
both databases. The shortcut must also have answered them (not passed them on).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from api_support import FakeQueue, insert_job, make_token
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.settings import Settings
from server.app import create_app
from server.auth import SESSION_COOKIE
from server.routes import job_poll

#: name -> (path under /jobs/, headers, cookies); ``{job}``/``{other}``/``{token}``/``{alice}``/``{etag}`` filled in.
REQUESTS: dict[str, tuple[str, dict[str, str], dict[str, str]]] = {
    "200 admin": ("{job}", {"Authorization": "Bearer {token}"}, {}),
    "304 current tag": ("{job}", {"Authorization": "Bearer {token}", "If-None-Match": "{etag}"}, {}),
    "304 star": ("{job}", {"Authorization": "Bearer {token}", "If-None-Match": "*"}, {}),
    "200 stale tag list": ("{job}", {"Authorization": "Bearer {token}", "If-None-Match": '"x", W/"y"'}, {}),
    "200 empty If-None-Match": ("{job}", {"Authorization": "Bearer {token}", "If-None-Match": ""}, {}),
    "200 cookie": ("{job}", {}, {SESSION_COOKIE: "{token}"}),
    "401 no token": ("{job}", {}, {}),
    "401 basic": ("{job}", {"Authorization": "Basic dXNlcjpwdw=="}, {}),
    "401 bearer without token": ("{job}", {"Authorization": "Bearer"}, {}),
    "401 not a token": ("{job}", {"Authorization": "Bearer nonsense"}, {}),
    "401 unknown token": ("{job}", {"Authorization": "Bearer hc_unknown"}, {}),
    "404 unknown job": ("no-such-job", {"Authorization": "Bearer {token}"}, {}),
    "404 NUL in the id": ("a%00b", {"Authorization": "Bearer {token}"}, {}),
    "404 another owner's job": ("{other}", {"Authorization": "Bearer {alice}"}, {}),
    "200 own job": ("{own}", {"Authorization": "Bearer {alice}"}, {}),
}


def _without_shortcut(app: FastAPI) -> FastAPI:
    app.user_middleware = [m for m in app.user_middleware if m.cls is not job_poll.JobPollShortcut]
    return app


@pytest.fixture
def apps(settings: Settings) -> Iterator[tuple[TestClient, TestClient]]:
    """A client of the app as built (with the shortcut), and one of the same app without the shortcut."""
    with (
        TestClient(create_app(settings, FakeQueue())) as fast,
        TestClient(_without_shortcut(create_app(settings, FakeQueue()))) as plain,
    ):
        yield fast, plain


@pytest.fixture
def shortcut_answers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The job ids the shortcut answered (it calls ``job_response`` through its own module's name)."""
    answered: list[str] = []
    original: Callable[..., Any] = job_poll.job_response

    async def counted(request: Any, job_id: str, *args: Any) -> Any:
        answered.append(job_id)
        return await original(request, job_id, *args)

    monkeypatch.setattr(job_poll, "job_response", counted)
    return answered


def test_the_shortcut_answers_every_poll_byte_for_byte_as_the_route(
    apps: tuple[TestClient, TestClient],
    sessions: sessionmaker[Session],
    database_url: str,
    admin_token: str,
    shortcut_answers: list[str],
) -> None:
    fast, plain = apps
    values = {
        "job": insert_job(sessions, status="running", latest={"step": 2, "loss": 0.5}),
        "other": insert_job(sessions, owner="bob"),
        "own": insert_job(sessions, owner="alice"),
        "token": admin_token,
        "alice": make_token(database_url, "alice"),
    }
    values["etag"] = plain.get(f"/jobs/{values['job']}", headers={"Authorization": f"Bearer {admin_token}"}).headers[
        "etag"
    ]
    for name, (path, headers, cookies) in REQUESTS.items():
        url = "/jobs/" + path.format(**values)
        filled = {key: value.format(**values) for key, value in headers.items()}
        jar = {key: value.format(**values) for key, value in cookies.items()}
        fast.cookies.clear()
        plain.cookies.clear()
        fast.cookies.update(jar)
        plain.cookies.update(jar)
        before = len(shortcut_answers)
        got, want = fast.get(url, headers=filled), plain.get(url, headers=filled)
        assert (got.status_code, got.headers.raw, got.content) == (want.status_code, want.headers.raw, want.content), (
            name
        )
        assert str(got.status_code) == name.split()[0], name
        assert len(shortcut_answers) == before + 1, f"{name}: not answered by the shortcut"


def test_head_and_other_paths_go_on_to_fastapi(
    apps: tuple[TestClient, TestClient], sessions: sessionmaker[Session], shortcut_answers: list[str]
) -> None:
    fast, plain = apps
    job_id = insert_job(sessions)
    for method, path in (("HEAD", f"/jobs/{job_id}"), ("GET", f"/jobs/{job_id}/"), ("PUT", f"/jobs/{job_id}")):
        got = fast.request(method, path, follow_redirects=False)
        want = plain.request(method, path, follow_redirects=False)
        assert (got.status_code, got.headers.raw, got.content) == (want.status_code, want.headers.raw, want.content)
    assert shortcut_answers == []


def test_a_poll_is_measured_under_its_route_template(
    apps: tuple[TestClient, TestClient], sessions: sessionmaker[Session], admin_token: str
) -> None:
    fast, _ = apps
    headers = {"Authorization": f"Bearer {admin_token}"}
    job_id = insert_job(sessions)
    assert fast.get(f"/jobs/{job_id}", headers=headers).status_code == 200
    metrics = fast.get("/metrics", headers=headers).text
    assert 'halfcast_http_request_duration_seconds_count{method="GET",route="/jobs/{job_id}",status="200"} 1.0' in (
        metrics
    )
