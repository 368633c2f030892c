"""Third-party chatter stays out of the logs unless the level is DEBUG."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from halfcast.common.quiet_logs import DROPPED_MESSAGES, QUIET_LOGGERS, quiet_third_party_logs


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    saved = {
        name: (logging.getLogger(name).level, list(logging.getLogger(name).filters))
        for name in (*QUIET_LOGGERS, *(name for name, _ in DROPPED_MESSAGES))
    }
    yield
    for name, (level, filters) in saved.items():
        logging.getLogger(name).setLevel(level)
        logging.getLogger(name).filters[:] = filters


def test_httpx_requests_and_kombu_hostname_notices_are_dropped(caplog: pytest.LogCaptureFixture) -> None:
    quiet_third_party_logs("INFO")
    with caplog.at_level(logging.INFO):
        logging.getLogger("httpx").info("HTTP Request: POST http://x/jobs")
        logging.getLogger("kombu.connection").warning("No hostname was supplied. Reverting to default 'localhost'")
        logging.getLogger("kombu.connection").warning("connection lost")
        logging.getLogger("httpx").warning("real trouble")
    assert [r.getMessage() for r in caplog.records] == ["connection lost", "real trouble"]


def test_debug_keeps_everything(caplog: pytest.LogCaptureFixture) -> None:
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    quiet_third_party_logs("DEBUG")
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("httpx").info("HTTP Request: GET http://x/jobs")
    assert [r.getMessage() for r in caplog.records] == ["HTTP Request: GET http://x/jobs"]
