"""The schema comes only from Alembic: the migrated database matches the ORM models exactly."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from database_support import fresh_database
from sqlalchemy import inspect, text

from halfcast.contracts.status import AttemptStatus, JobStatus
from halfcast.core.db.engine import make_engine
from halfcast.core.db.migrate import alembic_config, current_revision, head_revision, upgrade_database
from halfcast.core.db.models import ATTEMPT_STATUSES, STATUSES, Base

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with no tables: a new SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'nested' / 'halfcast.db'}"
        return
    yield from fresh_database(request.getfixturevalue("postgres_admin_url"))


def schema_diff(url: str) -> list[object]:
    """Alembic autogenerate's differences between the live schema and the models."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def test_migrated_schema_matches_the_models(empty_database_url: str) -> None:
    assert current_revision(empty_database_url) is None

    upgrade_database(empty_database_url)

    assert current_revision(empty_database_url) == head_revision()
    assert schema_diff(empty_database_url) == []


def test_upgrade_is_idempotent_and_keeps_rows(empty_database_url: str) -> None:
    upgrade_database(empty_database_url)
    engine = make_engine(empty_database_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO jobs (id, status, spec, created_at, updated_at, step, max_steps, world_size, attempt) "
                    "VALUES ('j1', 'queued', '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 0, 1, 1, 0)"
                )
            )
        upgrade_database(empty_database_url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT id FROM jobs")).scalars().all() == ["j1"]
    finally:
        engine.dispose()


def test_downgrade_removes_everything_and_upgrade_restores_it(empty_database_url: str) -> None:
    upgrade_database(empty_database_url)

    command.downgrade(alembic_config(empty_database_url), "base")
    engine = make_engine(empty_database_url)
    try:
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()
    upgrade_database(empty_database_url)

    assert schema_diff(empty_database_url) == []


def test_upgrade_works_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"

    upgrade_database(url)

    assert current_revision(url) == head_revision()


def test_alembic_command_line_from_the_repository(tmp_path: Path) -> None:
    env = os.environ | {"HALFCAST_DATA_DIR": str(tmp_path / "data")}
    env.pop("HALFCAST_DATABASE_URL", None)

    result = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    assert current_revision(f"sqlite:///{tmp_path / 'data' / 'halfcast.db'}") == head_revision()


def test_the_columns_statuses_are_the_contracts_enums() -> None:
    assert STATUSES == ("queued", "starting", "running", "cancelling", "succeeded", "failed", "cancelled", "gathering")
    assert tuple(JobStatus) == STATUSES and tuple(AttemptStatus) == ATTEMPT_STATUSES
    assert ATTEMPT_STATUSES == ("succeeded", "failed", "cancelled", "requeued")


def test_0002_keeps_rows_and_backfills_the_attempts(empty_database_url: str) -> None:
    command.upgrade(alembic_config(empty_database_url), "0001")
    engine = make_engine(empty_database_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO jobs (id, status, spec, created_at, updated_at, started_at, finished_at, step, max_steps, "
                "world_size, attempt, worker_id, error_reason) VALUES "
                "('done', 'failed', '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, "
                "3, 5, 1, 1, 'w/1', 'rank_failed'), "
                "('live', 'running', '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, NULL, 0, 5, 1, 2, "
                "'w/2', NULL), "
                "('new', 'queued', '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, NULL, NULL, 0, 5, 1, 0, NULL, NULL)"
            ))  # fmt: skip  # a table, laid out by hand
            conn.execute(text("INSERT INTO step_records (job_id, step, time, data) VALUES ('done', 1, 1.0, '{}')"))
        upgrade_database(empty_database_url)
        with engine.connect() as conn:
            attempts = conn.execute(
                text("SELECT job_id, attempt, worker_id, status, reason FROM attempts ORDER BY job_id")
            ).all()
            assert [tuple(row) for row in attempts] == [
                ("done", 1, "w/1", "failed", "rank_failed"),
                ("live", 2, "w/2", None, None),
            ]
            assert conn.execute(text("SELECT count(*) FROM step_records")).scalar_one() == 1
            assert conn.execute(text("SELECT count(*) FROM jobs WHERE lease_expires_at IS NULL")).scalar_one() == 3
    finally:
        engine.dispose()
    assert schema_diff(empty_database_url) == []


def test_0006_copies_each_jobs_newest_evaluation_into_eval_records(empty_database_url: str) -> None:
    command.upgrade(alembic_config(empty_database_url), "0005")
    engine = make_engine(empty_database_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO jobs (id, status, spec, created_at, updated_at, step, max_steps, world_size, attempt, eval) "
                "VALUES ('evaluated', 'succeeded', '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 5, 5, 1, 1, "
                "'{\"step\": 5, \"time\": 12.5, \"loss\": 0.25, \"accuracy\": 0.9}'), "
                "('never', 'queued', '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 0, 5, 1, 0, NULL)"
            ))  # fmt: skip  # a table, laid out by hand
        upgrade_database(empty_database_url)
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT job_id, step, time FROM eval_records")).all()
        assert [tuple(row) for row in rows] == [("evaluated", 5, 12.5)]
    finally:
        engine.dispose()
    assert schema_diff(empty_database_url) == []


def _told_tables(url: str) -> set[str]:
    """The tables with 0017's change trigger (none on SQLite)."""
    engine = make_engine(url)
    try:
        if engine.dialect.name != "postgresql":
            return set()
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT tgrelid::regclass::text FROM pg_trigger WHERE tgname = 'halfcast_job_read_changed'")
            )
            return {row[0] for row in rows}
    finally:
        engine.dispose()


def test_0017_tells_the_job_resources_tables_on_postgresql_and_goes_back(empty_database_url: str) -> None:
    upgrade_database(empty_database_url)
    on_postgresql = empty_database_url.startswith("postgresql")
    expected = {"jobs", "attempts", "job_members", "api_tokens"} if on_postgresql else set()
    assert _told_tables(empty_database_url) == expected
    command.downgrade(alembic_config(empty_database_url), "0016")
    assert _told_tables(empty_database_url) == set()
    upgrade_database(empty_database_url)
    assert _told_tables(empty_database_url) == expected
