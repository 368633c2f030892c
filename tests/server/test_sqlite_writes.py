"""SQLite: a transaction that reads before it writes, run with WRITE_TRANSACTION, never meets "database is locked".

A deferred transaction that reads, then writes after another connection committed,
fails at once with SQLITE_BUSY_SNAPSHOT (no busy wait; phoenix#3949). With
``WRITE_TRANSACTION`` it starts with ``BEGIN IMMEDIATE`` and the other writer waits.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from halfcast.core.db.engine import WRITE_TRANSACTION, make_engine


def _read_then_write(url: str, immediate: bool) -> list[str]:
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v INTEGER)"))
        conn.execute(text("INSERT OR REPLACE INTO t VALUES (1, 0)"))
    errors: list[str] = []
    reading = threading.Event()

    def other_writer() -> None:
        reading.wait()
        try:
            with engine.begin() as conn:
                conn.execute(text("UPDATE t SET v = v + 10 WHERE k = 1"))
        except OperationalError as exc:
            errors.append(f"other: {exc}")

    thread = threading.Thread(target=other_writer)
    thread.start()
    options = WRITE_TRANSACTION if immediate else {}
    try:
        with engine.execution_options(**options).begin() as conn:
            value = conn.execute(text("SELECT v FROM t WHERE k = 1")).scalar_one()
            reading.set()
            time.sleep(0.5)  # the other writer commits now (deferred) or waits (immediate)
            conn.execute(text("UPDATE t SET v = :v WHERE k = 1"), {"v": value + 1})
    except OperationalError as exc:
        errors.append(f"reader: {exc}")
    reading.set()
    thread.join(timeout=30)
    engine.dispose()
    return errors


def test_a_write_transaction_waits_its_turn(tmp_path: Path) -> None:
    assert _read_then_write(f"sqlite:///{tmp_path / 'a.db'}", immediate=True) == []


def test_without_it_sqlite_fails_at_once(tmp_path: Path) -> None:
    """The failure the option prevents (so the test above can fail)."""
    errors = _read_then_write(f"sqlite:///{tmp_path / 'b.db'}", immediate=False)
    if not errors:
        pytest.skip("this SQLite build did not report the stale snapshot")
    assert any("database is locked" in error for error in errors)
