"""Keep passwords of database and broker URLs out of logs, stored errors and API answers.

:func:`redact_urls` masks the password of every ``scheme://user:password@host`` URL
in a text (``postgresql+psycopg://postgres:***@db/halfcast``), the way SQLAlchemy's
``render_as_string(hide_password=True)`` does for one URL. It is applied where text
leaves a process: log records (:func:`install_log_redaction`, a filter on the
logging handlers), job error messages as they are written to the database
(:class:`server.db.redacted.RedactedText`), API error details, ``/readyz`` and the
CLI's error output. ``repr(Settings())`` masks its URLs too (:mod:`server.settings`).
"""

from __future__ import annotations

import logging
import re

#: What replaces a password.
MASK = "***"
#: ``scheme://`` then userinfo ``user:password@`` (SQLAlchemy's URL grammar allows ``:`` and ``/`` in a password).
_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*):(?P<password>[^@\s]+)@")
#: Loggers that get handlers of their own under uvicorn (besides the root logger).
_HANDLER_LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access")


def redact_urls(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***`` (user, host and path kept)."""
    return _CREDENTIALS.sub(lambda m: f"{m.group('head')}:{MASK}@", text)


class RedactingFilter(logging.Filter):
    """A handler filter that masks URL passwords in a record's message and its formatted traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite ``record`` in place (message pre-rendered, traceback pre-formatted); never drop it."""
        message = record.getMessage()
        redacted = redact_urls(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_urls(record.exc_text)
        return True


def install_log_redaction() -> None:
    """Add a :class:`RedactingFilter` to every handler of the root and uvicorn loggers (idempotent).

    Call it after logging is configured (``basicConfig``, uvicorn's config); with no
    handler anywhere, ``logging.lastResort`` gets it.
    """
    handlers = [handler for name in _HANDLER_LOGGERS for handler in logging.getLogger(name).handlers]
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    for handler in handlers:
        if not any(isinstance(existing, RedactingFilter) for existing in handler.filters):
            handler.addFilter(RedactingFilter())
