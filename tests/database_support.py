"""Fresh PostgreSQL databases for tests: created empty, dropped (connections and all) afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator


def fresh_database(admin_url: str) -> Iterator[str]:
    """Yield the URL of a new, empty database on ``admin_url``'s server; drop it when resumed.

    Its sessions commit without waiting for the WAL to reach the disk (``synchronous_commit = off``): a
    test database never outlives a crash of its server (the fault tests that stop PostgreSQL run their
    own, :mod:`private_services`), and some 750 tests each wait for a few fsyncs otherwise. What a
    commit makes visible, and when, is unchanged.
    """
    from sqlalchemy import create_engine, text

    name = f"halfcast_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
        conn.execute(text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
    try:
        yield f"{admin_url.rsplit('/', 1)[0]}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
