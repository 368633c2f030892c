"""Keep third-party chatter out of Halfcast's logs (the API, the worker and the CLI).

Each entry here is a message a user cannot act on: httpx's line per HTTP request
(the CLI already reports every result), Alembic's plugin and dialect notices at every
start, kombu's "No hostname was supplied" (the embedded ``filesystem://`` broker has no
host by design) and Celery's per-task "succeeded" trace (the worker logs each job's
outcome itself; failures still log at ERROR). With ``--log-level DEBUG`` nothing is
quietened.
"""

from __future__ import annotations

import logging

#: Loggers raised to WARNING unless the configured level is DEBUG.
QUIET_LOGGERS = ("httpx", "httpcore", "alembic.runtime.plugins", "alembic.runtime.migration", "celery.app.trace")
#: (logger, message prefix) pairs dropped at any level but DEBUG.
DROPPED_MESSAGES = (("kombu.connection", "No hostname was supplied"),)


class _DropPrefix(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def quiet_third_party_logs(level: int | str = logging.INFO) -> None:
    """Apply :data:`QUIET_LOGGERS` and :data:`DROPPED_MESSAGES` (idempotent); nothing at DEBUG."""
    numeric = logging.getLevelName(level) if isinstance(level, str) else level  # "DEBUG" -> 10
    if numeric == logging.DEBUG:
        return
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name, prefix in DROPPED_MESSAGES:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropPrefix) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_DropPrefix(prefix))
