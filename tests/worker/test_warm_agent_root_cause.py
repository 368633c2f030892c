"""The warm launcher names the rank killed by a signal as the root cause, even when its peer is reaped first.

A flaky failure of ``test_warm_start.py::test_a_failed_rank_stops_the_others_and_is_named_as_the_root_cause``
under the suite's load: rank 1 SIGKILLed itself, rank 0 saw the connection close and exited 1, and the
launcher reaped rank 0 first (rank 1 was still inside ``exit``), so it named rank 0. ``dying_ranks.py``
makes that order certain.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from worker.warm.agent import _is_exiting

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def test_a_rank_killed_by_a_signal_is_the_cause_though_its_peer_is_reaped_first() -> None:
    done = subprocess.run(
        [sys.executable, str(HERE / "dying_ranks.py")],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.split() == ["1", str(-signal.SIGKILL)], done.stdout + done.stderr


def test_a_live_process_is_not_exiting_a_zombie_is_and_a_reaped_one_is_gone() -> None:
    assert not _is_exiting(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30.0
    while not _is_exiting(child.pid):  # exited, not yet reaped: a zombie
        assert time.monotonic() < deadline, "a child that exited never showed as exiting"
        time.sleep(0.01)
    child.wait()
    assert not _is_exiting(child.pid)
