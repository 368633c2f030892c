"""``halfcast db upgrade``: apply the Alembic migrations to the configured database."""

from __future__ import annotations

import argparse
import logging
import sys

from server.settings import Settings

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``db`` command group."""
    parser = subparsers.add_parser("db", help="database schema commands")
    commands = parser.add_subparsers(dest="db_command", metavar="DB_COMMAND", required=True)
    upgrade = commands.add_parser("upgrade", help="apply every pending migration (HALFCAST_DATABASE_URL)")
    upgrade.set_defaults(handler=run_upgrade)


def run_upgrade(_args: argparse.Namespace) -> int:
    """Migrate the database of the current settings to the newest revision."""
    from server.db.migrate import head_revision, upgrade_database

    settings = Settings()
    upgrade_database(settings.effective_database_url)
    sys.stdout.write(f"database at revision {head_revision()}\n")
    return 0
