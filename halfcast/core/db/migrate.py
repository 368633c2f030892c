"""Programmatic Alembic: bring a database to the newest schema from any working directory.

The schema is created and changed only by the migrations in the ``migrations``
package (never ``create_all``); this module finds them next to the installed package.
"""

from __future__ import annotations

import importlib.util
import logging
from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url

from halfcast.core.db.engine import make_engine

log = logging.getLogger(__name__)


def migrations_dir() -> Path:
    """Folder of the ``migrations`` package (holding ``env.py`` and ``versions/``).

    Raises ``RuntimeError`` if the package cannot be found on ``sys.path``.
    """
    spec = importlib.util.find_spec("migrations")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the 'migrations' package is not importable; is Halfcast installed?")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def alembic_config(url: str) -> Config:
    """An Alembic ``Config`` for ``url`` that needs no ``alembic.ini``."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    # ConfigParser interpolates '%': escape it (URL-encoded passwords contain it).
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


@cache
def head_revision() -> str:
    """The newest revision id in ``migrations/versions``."""
    heads = ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"expected exactly one migration head, found {heads}")
    return heads[0]


def _sqlite_file(url: str) -> Path | None:
    """The file of a file-backed SQLite URL, else ``None``."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        return Path(parsed.database).expanduser()
    return None


def ensure_sqlite_folder(url: str) -> None:
    """Create the parent folder of a file-backed SQLite URL (no-op for other databases)."""
    path = _sqlite_file(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)


def upgrade_database(url: str) -> None:
    """Apply every pending migration to the database at ``url`` (idempotent).

    Creates the parent folder of a SQLite file. Raises ``sqlalchemy.exc.OperationalError``
    when the database cannot be reached.
    """
    ensure_sqlite_folder(url)
    log.info("migrating %s to %s", make_url(url).render_as_string(hide_password=True), head_revision())
    command.upgrade(alembic_config(url), "head")


def current_revision(url: str) -> str | None:
    """The revision the database at ``url`` is at, or ``None`` if it was never migrated.

    A SQLite file that does not exist yet is reported as ``None`` and not created.
    """
    path = _sqlite_file(url)
    if path is not None and not path.exists():
        return None
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
