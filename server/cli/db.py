"""``halfcast db upgrade``: apply the Alembic migrations to the configured database."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from halfcast.common.redact import redact_urls
from halfcast.core.settings import Settings

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``db`` command group."""
    parser = subparsers.add_parser("db", help="database schema commands")
    commands = parser.add_subparsers(dest="db_command", metavar="DB_COMMAND", required=True)
    upgrade = commands.add_parser("upgrade", help="apply every pending migration (HALFCAST_DATABASE_URL)")
    upgrade.set_defaults(handler=run_upgrade)


def run_upgrade(_args: argparse.Namespace) -> int:
    """Migrate the database of the current settings to the newest revision.

    Returns 1 with a one-line error (the URL's password masked) when the database
    cannot be reached or the URL is malformed.
    """
    from halfcast.core.db.migrate import head_revision, upgrade_database

    url = Settings().effective_database_url
    try:
        upgrade_database(url)
    except (SQLAlchemyError, ValueError) as exc:
        log.debug("migration failed", exc_info=True)
        message = " ".join(f"{type(exc).__name__}: {exc}".split())
        sys.stderr.write(redact_urls(f"error: cannot migrate the database at {url}: {message}") + "\n")
        return 1
    sys.stdout.write(f"database at revision {head_revision()}\n")
    return 0


@contextmanager
def operator_session() -> Iterator[Session]:
    """A session on ``HALFCAST_DATABASE_URL`` (or the embedded default) for operator commands; disposed after."""
    from halfcast.core.db.engine import make_engine, make_session_factory

    engine = make_engine(Settings().effective_database_url)
    try:
        with make_session_factory(engine)() as session:
            yield session
    finally:
        engine.dispose()
