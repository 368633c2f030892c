"""``halfcast quotas set|list|clear`` on the database, each change audited (``quota.set``, ``quota.clear``)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from halfcast.cli import main
from halfcast.core.db.models import AuditEvent, OwnerQuota
from halfcast.core.db.quotas import QuotaLimits, get_override, set_quota


@pytest.fixture
def cli_database(monkeypatch: pytest.MonkeyPatch, database_url: str) -> str:
    """The CLI's ``HALFCAST_DATABASE_URL`` is the test database; no default quota is set."""
    monkeypatch.setenv("HALFCAST_DATABASE_URL", database_url)
    for name in ("MAX_ACTIVE_JOBS", "MAX_GPUS", "MAX_QUEUED_JOBS", "MAX_STORAGE_BYTES"):
        monkeypatch.delenv(f"HALFCAST_QUOTA_{name}", raising=False)
    return database_url


def quota_events(sessions: sessionmaker[Session]) -> list[tuple[str, str, dict[str, object] | None]]:
    with sessions() as session:
        rows = session.scalars(select(AuditEvent).where(AuditEvent.action.like("quota.%")).order_by(AuditEvent.id))
        return [(row.action, row.subject, row.details) for row in rows]


def override(sessions: sessionmaker[Session], owner: str) -> QuotaLimits:
    with sessions() as session:
        return get_override(session, owner)


def test_set_changes_only_the_limits_given_and_is_audited(
    cli_database: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["quotas", "set", "alice", "--max-gpus", "4", "--max-queued-jobs", "10"]) == 0
    assert main(["quotas", "set", "alice", "--max-queued-jobs", "default", "--max-active-jobs", "3"]) == 0

    assert override(sessions, "alice") == QuotaLimits(max_active_jobs=3, max_gpus=4, max_queued_jobs=None)
    assert "max_active_jobs=3, max_gpus=4, max_queued_jobs=default" in capsys.readouterr().out
    [first, second] = quota_events(sessions)
    assert first == (
        "quota.set",
        "alice",
        {
            "set": {"max_gpus": 4, "max_queued_jobs": 10},
            "via": "cli",
            "override": {"max_active_jobs": None, "max_gpus": 4, "max_queued_jobs": 10, "max_storage_bytes": None},
        },
    )
    assert second[2] is not None and second[2]["set"] == {"max_queued_jobs": None, "max_active_jobs": 3}
    with sessions() as session:
        actor = session.scalars(select(AuditEvent.actor).where(AuditEvent.action == "quota.set")).first()
        assert actor is not None and actor.startswith("cli:")


@pytest.mark.parametrize("argv", [["quotas", "set", "alice"], ["quotas", "set", " ", "--max-gpus", "1"]])
def test_set_without_a_limit_or_owner_is_exit_2(
    cli_database: str, sessions: sessionmaker[Session], argv: list[str]
) -> None:
    assert main(argv) == 2
    assert quota_events(sessions) == []


@pytest.mark.parametrize("value", ["-1", "two", "1.5"])
def test_a_bad_limit_value_is_a_usage_error(cli_database: str, value: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["quotas", "set", "alice", "--max-gpus", value])
    assert exited.value.code == 2


def test_list_shows_the_defaults_and_every_override(
    cli_database: str,
    sessions: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HALFCAST_QUOTA_MAX_QUEUED_JOBS", "7")
    with sessions() as session:
        set_quota(session, "bob", {"max_gpus": 8}, actor="cli:test")
        set_quota(session, "alice", {"max_active_jobs": 2}, actor="cli:test")

    assert main(["quotas", "list"]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "OWNER",
        "MAX",
        "ACTIVE",
        "JOBS",
        "MAX",
        "GPUS",
        "MAX",
        "QUEUED",
        "JOBS",
        "MAX",
        "STORAGE",
        "BYTES",
    ]
    assert lines[1].split() == ["(server", "default)", "unlimited", "unlimited", "7", "unlimited"]
    assert lines[2].split() == ["alice", "2", "default", "(unlimited)", "default", "(7)", "default", "(unlimited)"]
    assert lines[3].split() == ["bob", "default", "(unlimited)", "8", "default", "(7)", "default", "(unlimited)"]


def test_clear_drops_the_override_and_is_audited_once(
    cli_database: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    with sessions() as session:
        set_quota(session, "alice", {"max_gpus": 2}, actor="cli:test")

    assert main(["quotas", "clear", "alice"]) == 0
    assert main(["quotas", "clear", "alice"]) == 0  # nothing left: nothing audited

    with sessions() as session:
        assert session.get(OwnerQuota, "alice") is None
    assert quota_events(sessions)[1:] == [
        (
            "quota.clear",
            "alice",
            {
                "previous": {
                    "max_active_jobs": None,
                    "max_gpus": 2,
                    "max_queued_jobs": None,
                    "max_storage_bytes": None,
                },
                "via": "cli",
            },
        )
    ]
    assert "had no override" in capsys.readouterr().out


def test_quota_events_are_listed_by_the_audit_route(cli_database: str, client: TestClient) -> None:
    assert main(["quotas", "set", "alice", "--max-gpus", "1"]) == 0
    assert main(["quotas", "clear", "alice"]) == 0

    for action in ("quota.set", "quota.clear"):
        response = client.get("/audit", params={"action": action})
        assert response.status_code == 200, response.text
        assert [event["subject"] for event in response.json()["events"]] == ["alice"]


def test_set_takes_the_storage_limit_of_registered_datasets_and_models(
    cli_database: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["quotas", "set", "alice", "--max-storage-bytes", "1073741824"]) == 0
    assert override(sessions, "alice") == QuotaLimits(max_storage_bytes=1 << 30)
    assert "max_storage_bytes=1073741824" in capsys.readouterr().out
    assert main(["quotas", "set", "alice", "--max-storage-bytes", "default"]) == 0
    assert override(sessions, "alice") == QuotaLimits()
