"""Waiting for a process to exit (pidfds, or a short sleep where they are missing): an exit ends the wait at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from worker.launch.exits import POLL_S, wait_for_exit


def _sleeper(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_the_wait_ends_when_the_process_exits_not_at_the_timeout() -> None:
    child = _sleeper(0.3)
    started = time.monotonic()
    wait_for_exit([child.pid, os.getpid()], timeout_s=60)  # one of them exits
    assert time.monotonic() - started < 20
    assert child.wait(timeout=20) == 0


def test_the_wait_ends_at_the_timeout_and_at_once_for_a_process_already_gone() -> None:
    child = _sleeper(60)
    try:
        started = time.monotonic()
        wait_for_exit([child.pid], timeout_s=0.3)
        assert 0.25 <= time.monotonic() - started < 20
    finally:
        child.kill()
        child.wait()
    started = time.monotonic()
    wait_for_exit([child.pid], timeout_s=60)  # reaped: no such process
    assert time.monotonic() - started < 20


def test_without_pidfds_it_sleeps_a_poll_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    started = time.monotonic()
    wait_for_exit([os.getpid()], timeout_s=60)
    assert POLL_S * 0.9 <= time.monotonic() - started < 20
