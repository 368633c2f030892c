"""Database and broker passwords never show: masking helper, settings repr, log records, /readyz, API errors, CLI."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_support import FakeQueue
from fastapi.testclient import TestClient
from live_server import free_port

from halfcast.cli import main as cli_main
from halfcast.common.redact import RedactingFilter, install_log_redaction, redact_urls
from halfcast.core.settings import Settings
from server.app import create_app
from server.http.errors import ApiError

CANARY = "CANARY-server-51c9"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            f"postgresql+psycopg://postgres:{CANARY}@127.0.0.1:5432/test",
            "postgresql+psycopg://postgres:***@127.0.0.1:5432/test",
        ),
        (f"redis://:{CANARY}@h:6379/0", "redis://:***@h:6379/0"),
        (f"amqp://guest:{CANARY}@rabbit//", "amqp://guest:***@rabbit//"),
        (f"rediss://default:{CANARY}:x/y@h/1", "rediss://default:***@h/1"),  # ':' and '/' inside a raw password
        (f"a sqla://u:{CANARY}@h/d and redis://:{CANARY}@r/0 end", "a sqla://u:***@h/d and redis://:***@r/0 end"),
        ("postgresql://postgres@127.0.0.1/test", "postgresql://postgres@127.0.0.1/test"),  # no password: unchanged
        ("http://127.0.0.1:8000/jobs", "http://127.0.0.1:8000/jobs"),
        ("sqlite:////data/halfcast.db", "sqlite:////data/halfcast.db"),
    ],
)
def test_redact_urls_masks_only_passwords(text: str, expected: str) -> None:
    assert redact_urls(text) == expected


def test_settings_repr_and_str_mask_the_service_urls() -> None:
    settings = Settings(database_url=f"postgresql+psycopg://u:{CANARY}@db/x", broker_url=f"redis://:{CANARY}@r/0")
    for text in (repr(settings), str(settings), f"{settings!r}"):
        assert CANARY not in text and "postgresql+psycopg://u:***@db/x" in text and "redis://:***@r/0" in text
    assert settings.database_url is not None and CANARY in settings.database_url  # the value itself is intact


def _captured_logger() -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger(f"redaction-test-{id(stream)}")
    logger.propagate = False
    logger.handlers = [handler]
    return logger, stream


def test_log_records_and_their_tracebacks_are_masked() -> None:
    logger, stream = _captured_logger()
    logger.warning("database %s is down", f"postgresql://u:{CANARY}@db/x")
    try:
        raise ConnectionError(f"cannot connect to redis://:{CANARY}@r:6379/0")
    except ConnectionError:
        logger.exception("broker error")
    text = stream.getvalue()
    assert CANARY not in text
    assert "postgresql://u:***@db/x" in text and "redis://:***@r:6379/0" in text and "Traceback" in text


def test_install_log_redaction_filters_the_root_handlers_once() -> None:
    handler = logging.StreamHandler(io.StringIO())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        install_log_redaction()
        install_log_redaction()
        assert sum(isinstance(f, RedactingFilter) for f in handler.filters) == 1
    finally:
        root.removeHandler(handler)


def test_api_error_details_are_masked() -> None:
    assert CANARY not in ApiError(503, f"could not be queued (redis://:{CANARY}@r/0)").body.detail


@pytest.fixture
def down_services(data_dir: Path, sqlite_template: Path) -> Iterator[TestClient]:
    """An app whose database URL and broker URL carry the canary and point at closed ports."""
    settings = Settings(
        data_dir=data_dir,
        database_url=f"postgresql+psycopg://postgres:{CANARY}@127.0.0.1:{free_port()}/nowhere",
        broker_url=f"redis://:{CANARY}@127.0.0.1:{free_port()}/0",
    )
    with TestClient(create_app(settings, FakeQueue())) as client:
        yield client


def test_readyz_with_services_down_names_them_without_passwords(
    down_services: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    response = down_services.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["checks"]["database"].startswith("down") and body["checks"]["broker"].startswith("down")
    assert CANARY not in response.text
    assert "readiness: database is down" in caplog.text and CANARY not in caplog.text


def test_db_upgrade_errors_mask_the_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A malformed URL (its parser error would echo parts of it) and an unreachable server: one masked line, exit 1."""
    monkeypatch.setenv("HALFCAST_DATA_DIR", str(tmp_path))
    for url in (
        f"postgresql+psycopg://postgres:{CANARY}@127.0.0.1:5432:x/db",
        f"postgresql+psycopg://postgres:{CANARY}@127.0.0.1:{free_port()}/db",
    ):
        monkeypatch.setenv("HALFCAST_DATABASE_URL", url)
        assert cli_main(["db", "upgrade"]) == 1
        out, err = capsys.readouterr()
        assert CANARY not in out + err
        assert "error: cannot migrate the database at postgresql+psycopg://postgres:***@127.0.0.1" in err


def test_db_upgrade_of_a_missing_postgres_database_masks_the_password(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The server answers (trust auth takes any password) but the database does not exist."""
    base = postgres_url.rsplit("/", 1)[0].replace("postgres@", f"postgres:{CANARY}@", 1)
    monkeypatch.setenv("HALFCAST_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("HALFCAST_DATABASE_URL", f"{base}/halfcast_no_such_database")
    assert cli_main(["db", "upgrade"]) == 1
    out, err = capsys.readouterr()
    assert CANARY not in out + err and "does not exist" in err and "postgres:***@" in err


def test_readyz_masks_a_probe_error_that_quotes_a_url(
    down_services: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some drivers put the URL in their errors: the answer and the log still show no password."""

    def failing_probe(*_: object) -> None:
        raise ConnectionError(f"cannot connect to redis://:{CANARY}@127.0.0.1:1/0")

    monkeypatch.setattr("server.routes.health.check_broker", failing_probe)
    response = down_services.get("/readyz")
    assert response.status_code == 503
    assert CANARY not in response.text and "redis://:***@127.0.0.1:1/0" in response.json()["checks"]["broker"]
