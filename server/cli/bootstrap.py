"""First start of the embedded default: create an admin token for the local user and save it.

``halfcast up`` calls :func:`ensure_first_token` after migrating. When the database
has never had a token, it creates an admin token owned by the OS user, writes it to
``<data_dir>/token`` (mode 0600; the CLI reads it from there) and returns it so it
can be printed once. Later starts return ``None`` and create nothing.
"""

from __future__ import annotations

import getpass
import logging

from halfcast.cli.credentials import token_path, write_token_file
from halfcast.core.settings import Settings

log = logging.getLogger(__name__)


def local_owner() -> str:
    """The OS user's name (``local`` when it has none)."""
    try:
        return getpass.getuser() or "local"
    except (KeyError, OSError):
        return "local"


def ensure_first_token(settings: Settings) -> str | None:
    """Create, save and return the first admin token, or ``None`` if any token already exists (or auth is off).

    Raises ``OSError`` when the token file cannot be written (the token is created first).
    """
    from halfcast.core.db.engine import begin_write, make_engine, make_session_factory
    from halfcast.core.db.tokens import count_tokens, create_token
    from server.cli.tokens import cli_actor

    if not settings.auth:
        return None
    engine = make_engine(settings.effective_database_url)
    try:
        with make_session_factory(engine)() as session:
            begin_write(session)  # count and insert in one write transaction: two starts make one token
            if count_tokens(session) > 0:
                return None
            token = create_token(session, local_owner(), admin=True, actor=cli_actor(), via="halfcast up")
    finally:
        engine.dispose()
    write_token_file(token_path(settings), token.secret)
    log.info("created admin token %d for %s (saved to %s)", token.row.id, token.row.owner, token_path(settings))
    return token.secret
