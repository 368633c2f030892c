"""A text column that never stores a URL password: job error messages (:mod:`common.redact`)."""

from __future__ import annotations

from sqlalchemy import Dialect, Text
from sqlalchemy.types import TypeDecorator

from common.redact import redact_urls


class RedactedText(TypeDecorator[str]):
    """``Text`` whose written values pass through :func:`common.redact.redact_urls`.

    Every write goes through it, ORM or Core ``update().values(...)`` alike, so a
    failure message quoting a database or broker URL is stored with ``***`` for its
    password. The database sees plain ``TEXT``: no migration is involved.
    """

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        """The value to store: ``value`` with URL passwords masked."""
        return None if value is None else redact_urls(value)
