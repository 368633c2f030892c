"""Run several long-lived child processes together and stop them together.

Used by ``halfcast up`` for the API and the worker. A child with a
:class:`RestartPolicy` (the worker) is started again when it exits on its own, after
a growing delay (1 s, 2 s, 4 s, ... up to ``max_delay_s``; back to 1 s once it has
run ``stable_s``), so whatever kills a worker does not leave the host without one;
a child that exits ``max_restarts`` times within ``window_s`` is crash-looping
(a bad setting, say) and stops everything. A child without a policy (the API) that
exits stops the others. On SIGINT/SIGTERM every child gets SIGTERM, then SIGKILL
after its grace period. Each child leads its own process group, so a terminal's
Ctrl-C reaches only the supervisor, which then stops the children in order.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from types import FrameType

log = logging.getLogger(__name__)

#: Seconds between checks of the children.
POLL_S = 0.2


@dataclass(frozen=True)
class RestartPolicy:
    """When a child that exits on its own is started again (see the module docstring)."""

    max_restarts: int = 5
    window_s: float = 60.0
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    stable_s: float = 60.0


@dataclass
class Child:
    """One supervised command: a name for logs, the command, its stop grace period and restart policy."""

    name: str
    command: Sequence[str]
    grace_s: float = 15.0
    restart: RestartPolicy | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    started_at: float = field(default=0.0, repr=False)
    exits: list[float] = field(default_factory=list, repr=False)
    restart_at: float | None = field(default=None, repr=False)

    def start(self, env: Mapping[str, str]) -> None:
        """Start the command as the leader of a new process group (stdout/stderr inherited)."""
        self.popen = subprocess.Popen(list(self.command), env=dict(env), process_group=0)
        self.started_at, self.restart_at = time.monotonic(), None
        log.info("started %s (pid %d)", self.name, self.popen.pid)

    def schedule_restart(self, now: float) -> bool:
        """After an exit on its own: when to start it again; ``False`` if it may not (no policy, crash loop)."""
        policy = self.restart
        if policy is None:
            return False
        if now - self.started_at >= policy.stable_s:
            self.exits.clear()  # it ran long enough: a new failure starts a new series
        self.exits = [t for t in self.exits if now - t < policy.window_s] + [now]
        if len(self.exits) > policy.max_restarts:
            return False
        delay = min(policy.max_delay_s, policy.first_delay_s * 2 ** (len(self.exits) - 1))
        self.restart_at = now + delay
        return True

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
    with suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


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
                failed = self._wait(env)
            finally:
                self.stop()
        return failed

    def _wait(self, env: Mapping[str, str]) -> int:
        while not self.stop_requested.wait(POLL_S):
            for child in self.children:
                if (failed := self._check(child, env)) is not None:
                    return failed
        return 0

    def _check(self, child: Child, env: Mapping[str, str]) -> int | None:
        """Restart ``child`` when due; after an exit, schedule its restart, else the status to stop with."""
        now = time.monotonic()
        if child.restart_at is not None:
            if now >= child.restart_at:
                child.start(env)
            return None
        if (code := child.exited()) is None:
            return None
        if child.schedule_restart(now):
            log.error(
                "%s exited with status %d; starting it again in %.0f s",
                child.name,
                code,
                (child.restart_at or now) - now,
            )
            return None
        what = f"{len(child.exits)} times in {child.restart.window_s:.0f} s" if child.restart else f"with status {code}"
        log.error("%s exited %s; stopping the others", child.name, what)
        return code or 1

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
