"""The tests' PostgreSQL databases: fresh per session, committing without waiting for the disk."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from halfcast.core.db.engine import make_engine

pytestmark = pytest.mark.postgres


def test_a_fresh_database_commits_without_waiting_for_the_wal_flush(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SHOW synchronous_commit")).scalar_one() == "off"
    finally:
        engine.dispose()
