"""A text column that never stores a URL password or a server path: job error messages (:mod:`halfcast.common.redact`)."""

from __future__ import annotations

from sqlalchemy import Dialect, Text
from sqlalchemy.types import TypeDecorator

from halfcast.common.redact import redact_for_client


class RedactedText(TypeDecorator[str]):
    """``Text`` whose written values pass through :func:`halfcast.common.redact.redact_for_client`.

    Every write goes through it, ORM or Core ``update().values(...)`` alike, so a
    failure message quoting a database or broker URL is stored with ``***`` for its
    password, and one quoting a file by its absolute path is stored with the path made
    run-relative or cut to its last part (the client never learns the server's layout).
    The database sees plain ``TEXT``: no migration is involved.
    """

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        """The value to store: ``value`` with URL passwords masked and server paths hidden."""
        return None if value is None else redact_for_client(value)
