"""Tokens, the dashboard's session cookie, per-owner idempotency keys, the audit log, and the CLI's token commands."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_support import VALID_SPEC, FakeQueue, insert_job, make_token
from fastapi.testclient import TestClient
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from halfcast.cli import main
from halfcast.cli.credentials import resolve_token
from halfcast.core.db.models import ApiToken, Worker, utcnow
from halfcast.core.settings import Settings
from server.app import create_app
from server.auth import SESSION_COOKIE, ExposureError, is_loopback
from server.cli.bootstrap import ensure_first_token


@pytest.fixture
def app_client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings, FakeQueue())) as client:
        yield client


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_session_cookie_authenticates_reads_but_never_writes(
    app_client: TestClient, database_url: str, sessions: sessionmaker[Session]
) -> None:
    token = make_token(database_url, "alice")
    job_id = insert_job(sessions, status="running", owner="alice")

    login = app_client.post("/session", headers=_bearer(token))

    assert login.status_code == 200 and login.json() == {"owner": "alice", "admin": False}
    cookie = login.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}={token};")
    assert all(flag in cookie.lower() for flag in ("httponly", "samesite=strict", "path=/"))
    assert app_client.get(f"/jobs/{job_id}").status_code == 200  # the cookie alone
    cancel = app_client.post(f"/jobs/{job_id}/cancel")  # CSRF: a cookie never authorises a state change
    assert cancel.status_code == 401
    assert app_client.post("/jobs", json=VALID_SPEC).status_code == 401
    assert app_client.delete("/session", headers=_bearer(token)).status_code == 204
    assert app_client.get(f"/jobs/{job_id}").status_code == 401


def test_the_session_cookie_authenticates_a_checkpoint_head_as_it_does_its_get(
    app_client: TestClient, database_url: str, sessions: sessionmaker[Session], settings: Settings
) -> None:
    """docs/api.md: the cookie is accepted on GET and HEAD; HEAD on a checkpoint was a 405 for everyone."""
    token, other = make_token(database_url, "alice"), make_token(database_url, "bob")
    job_id = insert_job(sessions, status="succeeded", owner="alice")
    folder = settings.runs_dir / job_id / "attempt-1" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "final.pt").write_bytes(b"weights")
    url = f"/jobs/{job_id}/checkpoints/final.pt"

    def by_cookie(method: str, secret: str | None) -> int:
        cookie = {"Cookie": f"{SESSION_COOKIE}={secret}"} if secret else {}
        return app_client.request(method, url, headers=cookie).status_code

    assert [by_cookie(method, token) for method in ("GET", "HEAD")] == [200, 200]
    assert [by_cookie(method, other) for method in ("GET", "HEAD")] == [404, 404]
    assert [by_cookie(method, None) for method in ("GET", "HEAD")] == [401, 401]


@pytest.mark.parametrize(
    "header", ["Basic YWxpY2U6cHc=", "Bearer", "Bearer hc_not-a-token", "Bearer not-even-prefixed"]
)
def test_malformed_or_unknown_credentials_are_401(app_client: TestClient, header: str) -> None:
    response = app_client.get("/jobs", headers={"Authorization": header})
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"


def test_idempotency_keys_are_per_owner(app_client: TestClient, database_url: str) -> None:
    alice, bob = make_token(database_url, "alice"), make_token(database_url, "bob")
    key = {"Idempotency-Key": "same-key"}

    first = app_client.post("/jobs", json=VALID_SPEC, headers={**_bearer(alice), **key})
    other = app_client.post("/jobs", json=VALID_SPEC, headers={**_bearer(bob), **key})
    again = app_client.post("/jobs", json=VALID_SPEC, headers={**_bearer(alice), **key})

    assert (first.status_code, other.status_code, again.status_code) == (201, 201, 200)
    assert other.json()["id"] != first.json()["id"] == again.json()["id"]


def test_jobs_from_before_authentication_are_seen_by_admins_only(
    app_client: TestClient, database_url: str, sessions: sessionmaker[Session]
) -> None:
    legacy = insert_job(sessions, owner=None)
    user, admin = make_token(database_url, "alice"), make_token(database_url, "root", admin=True)

    assert app_client.get(f"/jobs/{legacy}", headers=_bearer(user)).status_code == 404
    assert app_client.get("/jobs", headers=_bearer(user)).json()["jobs"] == []
    assert app_client.get(f"/jobs/{legacy}", headers=_bearer(admin)).status_code == 200


def test_workers_show_a_user_only_their_own_running_jobs(
    app_client: TestClient, database_url: str, sessions: sessionmaker[Session]
) -> None:
    mine, theirs = (
        insert_job(sessions, status="running", owner="alice"),
        insert_job(sessions, status="running", owner="bob"),
    )
    with sessions() as session:
        now = utcnow()
        session.add(Worker(id="w/1", hostname="w", pid=1, gpus=[], concurrency=2, started_at=now, heartbeat_at=now))
        session.execute(text("UPDATE jobs SET worker_id = 'w/1'"))
        session.commit()

    def running(token: str) -> list[str]:
        return app_client.get("/workers", headers=_bearer(token)).json()["workers"][0]["running_jobs"]

    assert running(make_token(database_url, "alice")) == [mine]
    assert sorted(running(make_token(database_url, "root", admin=True))) == sorted([mine, theirs])


def test_creation_cancellation_and_token_changes_are_audited(
    app_client: TestClient,
    database_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    settings: Settings,
) -> None:
    monkeypatch.setenv("HALFCAST_DATABASE_URL", database_url)
    assert main(["tokens", "create", "--owner", "alice"]) == 0
    alice = capsys.readouterr().out.strip()
    admin = make_token(database_url, "root", admin=True)
    job = app_client.post("/jobs", json=VALID_SPEC, headers=_bearer(alice)).json()
    assert app_client.post(f"/jobs/{job['id']}/cancel", headers=_bearer(admin)).status_code == 202
    assert main(["tokens", "revoke", "1"]) == 0

    page = app_client.get("/audit", headers=_bearer(admin), params={"limit": 3}).json()
    rest = app_client.get("/audit", headers=_bearer(admin), params={"cursor": page["next_cursor"]}).json()

    events = page["events"] + rest["events"]
    assert [(e["action"], e["actor"], e["subject"]) for e in events] == [
        ("token.revoke", events[0]["actor"], "1"),
        ("job.cancel", "root", job["id"]),
        ("job.create", "alice", job["id"]),
        ("token.create", events[3]["actor"], "2"),
        ("token.create", events[4]["actor"], "1"),
    ]
    assert events[0]["actor"].startswith("cli:") and events[4]["details"] == {
        "owner": "alice",
        "admin": False,
        "via": "cli",
    }
    assert events[1]["details"] == {"owner": "alice", "status": "cancelled"}
    assert all(e["at"].endswith(("Z", "+00:00")) for e in events) and rest["next_cursor"] is None
    assert (
        app_client.get("/audit", headers=_bearer(admin), params={"action": "job.create"}).json()["events"][0]["subject"]
        == job["id"]
    )
    assert app_client.get("/audit", headers=_bearer(admin), params={"cursor": "x"}).status_code == 422
    assert app_client.get("/jobs", headers=_bearer(alice)).status_code == 401  # revoked


def test_tokens_cli_prints_once_stores_only_the_hash_and_lists_no_secrets(
    database_url: str,
    sessions: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("HALFCAST_DATABASE_URL", database_url)
    assert main(["tokens", "create", "--owner", "ops", "--admin"]) == 0
    secret = capsys.readouterr().out.strip()
    assert secret.startswith("hc_") and len(secret) == 46
    with sessions() as session:
        row = session.scalars(select(ApiToken)).one()
        stored = " ".join(str(value) for value in session.execute(text("SELECT * FROM api_tokens")).one())
    assert secret not in stored and row.admin and row.owner == "ops"

    assert main(["tokens", "list"]) == 0
    listing = capsys.readouterr().out
    assert "ops" in listing and "yes" in listing and secret not in listing and row.token_hash not in listing

    path = tmp_path / "secrets" / "prom-token"
    assert main(["tokens", "create", "--owner", "prometheus", "--admin", "--file", str(path), "--if-missing"]) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().startswith("hc_")
    before = path.read_text()
    assert main(["tokens", "create", "--owner", "prometheus", "--file", str(path), "--if-missing"]) == 0
    assert path.read_text() == before
    assert main(["tokens", "revoke", "99"]) == 2
    assert main(["tokens", "create", "--owner", "  "]) == 2


def test_first_start_creates_one_admin_token_in_a_private_file(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    secret = ensure_first_token(settings)

    path = settings.resolved_data_dir / "token"
    assert secret is not None and path.read_text() == secret + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with sessions() as session:
        assert session.scalars(select(ApiToken.admin)).all() == [True]
    assert ensure_first_token(settings) is None  # later starts create nothing


def test_the_cli_takes_the_flag_then_the_environment_then_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HALFCAST_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("HALFCAST_TOKEN", raising=False)
    assert resolve_token(None) is None
    (tmp_path / "token").write_text("hc_file\n")
    assert resolve_token(None) == "hc_file"
    monkeypatch.setenv("HALFCAST_TOKEN", "hc_env")
    assert resolve_token(None) == "hc_env"
    assert resolve_token("hc_flag") == "hc_flag"


def test_auth_off_is_refused_on_an_open_address(
    data_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and not is_loopback("0.0.0.0")
    with pytest.raises(ExposureError, match="HALFCAST_AUTH=off"):
        create_app(Settings(data_dir=data_dir, auth=False, host="0.0.0.0"))
    monkeypatch.setenv("HALFCAST_AUTH", "off")
    for name in ("HALFCAST_HOST", "HALFCAST_DATA_DIR"):  # the commands write their options there: restore them
        monkeypatch.setenv(name, "placeholder")
    for command in ("api", "up"):
        assert main([command, "--host", "0.0.0.0", "--data-dir", str(data_dir)]) == 2
        assert "refusing to serve without authentication on 0.0.0.0" in capsys.readouterr().err
    assert not (data_dir / "halfcast.db").exists()  # refused before migrating


def test_with_auth_off_every_request_is_the_local_admin(settings: Settings, sessions: sessionmaker[Session]) -> None:
    settings.auth = False
    legacy = insert_job(sessions, owner=None)
    with TestClient(create_app(settings, FakeQueue())) as client:
        assert client.get(f"/jobs/{legacy}").status_code == 200
        assert client.post("/jobs", json=VALID_SPEC).json()["id"]
        assert client.get("/session").json() == {"owner": "local", "admin": True}
    assert os.environ.get("HALFCAST_AUTH") is None
