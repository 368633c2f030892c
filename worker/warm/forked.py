"""A launcher a standby forked, seen from the worker: what :class:`worker.launch.process_tree.RunProcess` needs of a ``Popen``.

The launcher is the standby's child, not the worker's, so the worker cannot ``waitpid``
it: its exit status comes from the standby's ``exited`` report
(:mod:`worker.warm.forkserver`), which :meth:`ForkedLauncher.exited` records. Signals go
to its pid only until that report: the standby has reaped it then, and the pid may be
reused. A standby that dies first takes its launchers' statuses with it (they get their
death signal and the kernel reaps them): the launcher then counts as stopped by that
signal, once it is gone from ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from worker.launch.deathsig import DEATH_SIGNAL
from worker.launch.process_tree import read_proc

#: The status of a launcher whose standby died before reporting its exit (what its death signal makes of it).
ORPHANED_EXIT = 128 + int(DEATH_SIGNAL)
#: Seconds between two looks at a launcher whose standby may have died, while waiting for it.
WAIT_STEP_S = 0.5


class ForkedLauncher:
    """One forked launcher: ``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``kill`` as ``Popen`` has."""

    def __init__(self, pid: int, standby_alive: Callable[[], bool]) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._standby_alive = standby_alive
        self._done = threading.Event()

    def exited(self, exitcode: int) -> None:
        """The standby reaped it with this status."""
        self.returncode = exitcode
        self._done.set()

    def poll(self) -> int | None:
        """Its exit status once reported (or once it is gone after its standby), else ``None``."""
        if not self._done.is_set() and not self._standby_alive() and not _alive(self.pid):
            self.exited(ORPHANED_EXIT)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Block until :meth:`poll` has a status; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = WAIT_STEP_S if deadline is None else min(WAIT_STEP_S, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(f"launcher {self.pid}", timeout or 0.0)
            self._done.wait(left)
        return code

    def send_signal(self, signum: int) -> None:
        """Signal the launcher unless it has been reaped (its pid may then be another process's)."""
        if not self._done.is_set():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL, as ``Popen.kill``."""
        self.send_signal(signal.SIGKILL)


def _alive(pid: int) -> bool:
    info = read_proc(pid)
    return info is not None and info.alive
