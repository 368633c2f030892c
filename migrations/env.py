"""Alembic environment for Halfcast.

The database URL is, in order: a connection handed over in
``config.attributes["connection"]`` (programmatic use), ``-x url=...`` on the
command line, ``sqlalchemy.url`` in the config, else
``halfcast.core.settings.Settings().effective_database_url`` (``HALFCAST_*`` environment).
The target metadata is :data:`halfcast.core.db.models.Base.metadata`; SQLite gets batch
mode so ``ALTER`` operations work there.
"""

from __future__ import annotations

import logging
from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from halfcast.core.db.engine import NO_TIMEOUTS, make_engine
from halfcast.core.db.migrate import ensure_sqlite_folder
from halfcast.core.db.models import Base
from halfcast.core.settings import Settings

config = context.config
log = logging.getLogger("alembic.env")

if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def database_url() -> str:
    """The URL to migrate: ``-x url=``, then ``sqlalchemy.url``, then the settings."""
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    return url or Settings().effective_database_url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit SQL to stdout (``alembic upgrade head --sql``) without a database."""
    url = database_url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate a live database, reusing a handed-over connection when there is one."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    url = database_url()
    ensure_sqlite_folder(url)
    engine = make_engine(url, timeouts=NO_TIMEOUTS)
    try:
        with engine.connect() as conn:
            _configure(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
