"""Keep passwords of database and broker URLs out of logs, stored errors and API answers.

:func:`redact_urls` masks the password of every ``scheme://user:password@host`` URL
in a text (``postgresql+psycopg://postgres:***@db/halfcast``), the way SQLAlchemy's
``render_as_string(hide_password=True)`` does for one URL. It is applied where text
leaves a process: log records (:func:`install_log_redaction`, a filter on the
logging handlers), job error messages as they are written to the database
(:class:`halfcast.core.db.redacted.RedactedText`), API error details, ``/readyz`` and the
CLI's error output. ``repr(Settings())`` masks its URLs too (:mod:`halfcast.core.settings`).

:func:`redact_paths` keeps the server's file system out of what a client reads (job error
messages): a path into a run directory becomes the run-relative form that ``resume_from``
takes (``<job id>/attempt-1/checkpoints/final.pt``), any other absolute path its last part
(``.../config.json``). :func:`redact_for_client` applies both.
"""

from __future__ import annotations

import logging
import re

#: What replaces a password.
MASK = "***"
#: ``scheme://`` then userinfo ``user:password@`` (SQLAlchemy's URL grammar allows ``:`` and ``/`` in a password).
_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*):(?P<password>[^@\s]+)@")
#: An absolute POSIX path of two parts or more, not inside a URL (``http://host/a/b``) or a relative path.
_ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~-])/(?:[\w.+@~%=,-]+/)+[\w.+@~%=,-]*")
#: Inside a path: a run directory's ``<job id>/attempt-<n>`` and what follows it.
_RUN_RELATIVE = re.compile(r"/(?P<rest>[0-9A-Za-z_-]{1,64}/attempt-\d+(?:/.*)?)$")
#: What stands for the directories of a path the client is not shown.
HIDDEN_DIRS = "..."
#: Loggers that get handlers of their own under uvicorn (besides the root logger).
_HANDLER_LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access")


def redact_urls(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***`` (user, host and path kept)."""
    return _CREDENTIALS.sub(lambda m: f"{m.group('head')}:{MASK}@", text)


def _client_path(match: re.Match[str]) -> str:
    path = match.group(0)
    run = _RUN_RELATIVE.search(path)
    if run is not None:
        return run.group("rest")
    last = path.rstrip("/").rsplit("/", 1)[-1]
    return f"{HIDDEN_DIRS}/{last}" if last else HIDDEN_DIRS


def redact_paths(text: str) -> str:
    """``text`` with every absolute path made run-relative (inside a run directory) or cut to its last part."""
    return _ABSOLUTE_PATH.sub(_client_path, text)


def redact_for_client(text: str) -> str:
    """``text`` with URL passwords masked and server paths hidden (:func:`redact_urls`, :func:`redact_paths`)."""
    return redact_paths(redact_urls(text))


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
