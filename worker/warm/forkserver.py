"""The standby's loop: fork a launcher for each assignment, report its start and its exit (:mod:`worker.warm`).

The standby stays single-threaded and never runs a job itself. For each
:class:`~worker.warm.assignment.Assignment` line on stdin it forks a child that leaves
the standby's session (``setsid``: the run's processes are its own session and groups,
as a cold run's are), asks for :data:`worker.launch.deathsig.DEATH_SIGNAL` when the standby
dies (so a worker killed with SIGKILL still stops the run: the standby has that request
towards the worker), takes over the run's directory, environment and launcher log, and
becomes its launcher (``launch``). The standby answers each assignment with a
``started`` :class:`~worker.warm.assignment.LauncherReport` and, once it has reaped that
launcher, an ``exited`` one with its exit status (negative: the signal), which the worker
reads in place of ``waitpid``: the launcher is the standby's child, not the worker's.

End of input (the worker let the standby go) ends the loop once every launcher it forked
has exited: a run never loses its launcher's parent, hence never gets a death signal,
because the worker stopped taking warm runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from worker.launch.deathsig import DEATH_SIGNAL, PARENT_GONE_EXIT, request_death_signal
from worker.warm.assignment import Assignment, LauncherReport

log = logging.getLogger("worker.warm.forkserver")

#: Runs an assignment in the forked launcher (it has taken the run over) and ends the process with its status.
Launch = Callable[[Assignment], NoReturn]
#: Exit status of a launcher whose body raised before it could end with its own.
LAUNCH_ERROR_EXIT = 70
#: Milliseconds between two checks for exited launchers where pidfds are not available.
REAP_POLL_MS = 100
#: Bytes read from stdin at a time.
READ_CHUNK = 1 << 16


class ForkServer:
    """The standby's state: its input buffer and the launchers it forked (pid -> pidfd, ``-1`` without one)."""

    def __init__(self, launch: Launch, take_over: Callable[[Assignment], None], stdin: int = 0, stdout: int = 1):
        self.launch = launch
        self.take_over = take_over
        self.stdin = stdin
        self.stdout = stdout
        self.pending = b""
        self.launchers: dict[int, int] = {}
        self.poller = select.poll()

    def serve(self) -> int:
        """Fork a launcher per assignment until end of input and no launcher is left; 0."""
        self.poller.register(self.stdin, select.POLLIN)
        reading = True
        while reading or self.launchers:
            events = self.poller.poll(None if self._all_waitable() else REAP_POLL_MS)
            if reading and any(fd == self.stdin for fd, _ in events):
                reading = self._read_assignments()
                if not reading:
                    self.poller.unregister(self.stdin)
            self._reap()
        return 0

    def _all_waitable(self) -> bool:
        return all(fd >= 0 for fd in self.launchers.values())

    def _read_assignments(self) -> bool:
        """Fork a launcher for each complete line read; ``False`` at end of input."""
        chunk = os.read(self.stdin, READ_CHUNK)
        if not chunk:
            return False
        self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            if line.strip():
                self._start(Assignment.model_validate_json(line))
        return True

    def _start(self, assignment: Assignment) -> None:
        pid = fork_launcher(assignment, self.launch, self.take_over, self._inherited_fds())
        fd = _pidfd(pid)
        self.launchers[pid] = fd
        if fd >= 0:
            self.poller.register(fd, select.POLLIN)
        self._report(LauncherReport(event="started", pid=pid))

    def _inherited_fds(self) -> list[int]:
        """Descriptors a launcher must not keep: the standby's pidfds (``take_over`` replaces its stdin and stdout)."""
        return [fd for fd in self.launchers.values() if fd >= 0]

    def _reap(self) -> None:
        """Collect every launcher that has exited and report its status."""
        while self.launchers:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = self.launchers.pop(pid, -1)
            if fd >= 0:
                self.poller.unregister(fd)
                os.close(fd)
            self._report(LauncherReport(event="exited", pid=pid, exitcode=os.waitstatus_to_exitcode(status)))

    def _report(self, report: LauncherReport) -> None:
        with contextlib.suppress(BrokenPipeError):  # the worker is gone: its death signal ends the standby
            os.write(self.stdout, report.model_dump_json().encode() + b"\n")


def fork_launcher(
    assignment: Assignment, launch: Launch, take_over: Callable[[Assignment], None], close_fds: list[int]
) -> int:
    """Fork the run's launcher; its pid, once it leads a session of its own. The child never returns here.

    The standby waits for the child's end of a pipe to close (after ``setsid``, or at its
    death): until then the child is in the standby's session, and the worker, which scans the
    launcher's session for the run's processes, would count the standby in.
    """
    standby = os.getpid()
    in_session, session_led = os.pipe()
    pid = os.fork()
    if pid:
        os.close(session_led)
        os.read(in_session, 1)  # b"": the child closed it (setsid done) or died
        os.close(in_session)
        return pid
    try:
        os.close(in_session)
        os.setsid()
        os.close(session_led)
        # the death signal must be able to end it until the launcher's own handlers are in (worker.warm.agent)
        signal.signal(DEATH_SIGNAL, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {DEATH_SIGNAL})
        if request_death_signal(DEATH_SIGNAL) and os.getppid() != standby:
            os._exit(PARENT_GONE_EXIT)
        for fd in close_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        take_over(assignment)
        launch(assignment)
    except BaseException:  # noqa: BLE001 (the launcher's last word goes to its log, whatever it was)
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
    os._exit(LAUNCH_ERROR_EXIT)


def _pidfd(pid: int) -> int:
    """A pidfd of ``pid`` (readable once it exits), or ``-1`` where the kernel gives none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1
