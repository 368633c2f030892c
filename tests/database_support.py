"""Fresh PostgreSQL databases for tests: created empty, dropped (connections and all) afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator


def fresh_database(admin_url: str) -> Iterator[str]:
    """Yield the URL of a new, empty database on ``admin_url``'s server; drop it when resumed."""
    from sqlalchemy import create_engine, text

    name = f"halfcast_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{admin_url.rsplit('/', 1)[0]}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
