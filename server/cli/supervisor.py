"""Run several long-lived child processes together and stop them together.

Used by ``halfcast up`` for the API and the worker: if one child exits, the others
are stopped; on SIGINT/SIGTERM every child gets SIGTERM, then SIGKILL after its
grace period. Each child leads its own process group, so a terminal's Ctrl-C
reaches only the supervisor, which then stops the children in order.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType

log = logging.getLogger(__name__)

#: Seconds between checks of the children.
POLL_S = 0.2


@dataclass
class Child:
    """One supervised command: a name for logs, the command, and its stop grace period."""

    name: str
    command: Sequence[str]
    grace_s: float = 15.0
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self, env: Mapping[str, str]) -> None:
        """Start the command as the leader of a new process group (stdout/stderr inherited)."""
        self.popen = subprocess.Popen(list(self.command), env=dict(env), process_group=0)
        log.info("started %s (pid %d)", self.name, self.popen.pid)

    def exited(self) -> int | None:
        """The exit status once the child has exited, else ``None``."""
        return None if self.popen is None else self.popen.poll()

    def terminate(self) -> None:
        """Send SIGTERM to the child (not its process group: it stops its own children)."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)

    def wait_or_kill(self, deadline: float) -> int | None:
        """Wait for the child until ``deadline`` (monotonic), then SIGKILL its process group."""
        if self.popen is None:
            return None
        try:
            return self.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0f s; killing it", self.name, self.grace_s)
            _killpg(self.popen.pid)
            return self.popen.wait()


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Supervisor:
    """Starts children, waits for a stop signal or a child's exit, and stops them all."""

    def __init__(self, children: Sequence[Child]) -> None:
        self.children = list(children)
        self.stop_requested = threading.Event()

    def run(self, env: Mapping[str, str]) -> int:
        """Run until SIGINT/SIGTERM (exit 0) or until a child exits (exit 1, or its status if non-zero)."""
        with self._signals():
            try:
                for child in self.children:
                    child.start(env)
                failed = self._wait()
            finally:
                self.stop()
        return failed

    def _wait(self) -> int:
        while not self.stop_requested.wait(POLL_S):
            for child in self.children:
                if (code := child.exited()) is not None:
                    log.error("%s exited with status %d; stopping the others", child.name, code)
                    return code or 1
        return 0

    def stop(self) -> None:
        """SIGTERM every running child, then wait for each (SIGKILL after its grace period)."""
        for child in self.children:
            child.terminate()
        for child in self.children:
            code = child.wait_or_kill(time.monotonic() + child.grace_s)
            if code is not None:
                log.info("%s stopped (status %d)", child.name, code)

    @contextmanager
    def _signals(self) -> Iterator[None]:
        def request_stop(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s: stopping", signal.Signals(signum).name)
            self.stop_requested.set()

        previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
