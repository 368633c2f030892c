"""The warm standby's fork server (worker/warm/forkserver.py) with a stand-in launch: no torch, milliseconds.

A forked "standby" serves assignments from a pipe; each launcher it forks ends with the status its
assignment names (or sleeps first), so the reports can be checked exactly.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import NoReturn

from worker.warm.assignment import Assignment, LauncherReport
from worker.warm.forkserver import ForkServer, fork_launcher

WAIT_S = 30.0


def _assignment(tmp_path: Path, *args: str) -> Assignment:
    return Assignment(
        run_dir=tmp_path, logs_dir=tmp_path / "logs", launcher_log=tmp_path / "launcher.log",
        processes=1, trainer_args=args, env={},
    )  # fmt: skip  # the run's paths on one line, the rest on the next


def _exit_with_args(assignment: Assignment) -> NoReturn:
    """Sleep ``trainer_args[1]`` seconds (if given), then exit with ``trainer_args[0]``."""
    if len(assignment.trainer_args) > 1:
        time.sleep(float(assignment.trainer_args[1]))
    os._exit(int(assignment.trainer_args[0]))


def _no_take_over(_assignment: Assignment) -> None:
    pass


def _start_server() -> tuple[int, int, int]:
    """Fork a process serving a :class:`ForkServer` on two pipes: (its pid, our write end, our read end)."""
    to_server, from_us = os.pipe()
    to_us, from_server = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(from_us)
        os.close(to_us)
        os._exit(ForkServer(_exit_with_args, _no_take_over, stdin=to_server, stdout=from_server).serve())
    os.close(to_server)
    os.close(from_server)
    return pid, from_us, to_us


def _reports(fd: int, count: int) -> list[LauncherReport]:
    """Read ``count`` report lines from ``fd``."""
    data = b""
    deadline = time.monotonic() + WAIT_S
    while data.count(b"\n") < count:
        assert time.monotonic() < deadline, data
        chunk = os.read(fd, 4096)
        assert chunk, f"the server ended after {data!r}"
        data += chunk
    return [LauncherReport.model_validate_json(line) for line in data.splitlines()]


def test_each_assignment_gets_a_launcher_and_its_own_exit_status(tmp_path: Path) -> None:
    server, write, read = _start_server()
    try:
        lines = [_assignment(tmp_path, "3", "0.3"), _assignment(tmp_path, "0")]
        os.write(write, b"".join(a.model_dump_json().encode() + b"\n" for a in lines))  # two at once, one write
        reports = _reports(read, 4)
    finally:
        os.close(write)  # end of input: the server ends once its launchers have
    started = [r.pid for r in reports if r.event == "started"]
    exited = {r.pid: r.exitcode for r in reports if r.event == "exited"}
    assert len(started) == 2 and server not in started
    assert exited == {started[0]: 3, started[1]: 0}
    assert reports.index(LauncherReport(event="exited", pid=started[1], exitcode=0)) < reports.index(
        LauncherReport(event="exited", pid=started[0], exitcode=3)
    )  # each reported when it ends, not in the order started
    _, status = os.waitpid(server, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    os.close(read)


def test_end_of_input_waits_for_the_launchers_still_running(tmp_path: Path) -> None:
    server, write, read = _start_server()
    os.write(write, _assignment(tmp_path, "0", "0.5").model_dump_json().encode() + b"\n")
    (started,) = _reports(read, 1)
    os.close(write)
    time.sleep(0.1)
    assert os.waitpid(server, os.WNOHANG) == (0, 0), "the server ended while its launcher ran"
    (exited,) = _reports(read, 1)
    assert (exited.event, exited.pid, exited.exitcode) == ("exited", started.pid, 0)
    os.waitpid(server, 0)
    os.close(read)


def test_a_launcher_leads_its_own_session_before_its_pid_is_handed_back(tmp_path: Path) -> None:
    """The worker scans the launcher's session for the run's processes from the moment it has the pid:
    were the launcher still in the standby's session then, the standby would count as the run's."""
    pids = [fork_launcher(_assignment(tmp_path, "0", "0.2"), _exit_with_args, _no_take_over, []) for _ in range(5)]
    sessions = [os.getsid(pid) for pid in pids]
    for pid in pids:
        os.waitpid(pid, 0)
    assert sessions == pids


def test_a_launcher_whose_body_raises_ends_with_an_error_status(tmp_path: Path) -> None:
    def take_over(_assignment: Assignment) -> None:
        raise RuntimeError("no such run directory")

    pid = fork_launcher(_assignment(tmp_path, "0"), _exit_with_args, take_over, [])
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 70


def test_a_launcher_gets_the_death_signal_when_its_standby_dies(tmp_path: Path) -> None:
    """Even when the standby had a handler of its own for that signal (inherited by a fork, unlike an exec):
    the launcher takes the default action until it installs its own (worker/warm/agent.py)."""
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server, write, read = _start_server()
    finally:
        signal.signal(signal.SIGTERM, previous)
    os.write(write, _assignment(tmp_path, "0", "60").model_dump_json().encode() + b"\n")
    (started,) = _reports(read, 1)
    os.kill(server, signal.SIGKILL)
    os.waitpid(server, 0)
    deadline = time.monotonic() + WAIT_S
    while Path(f"/proc/{started.pid}").exists() and b") Z" not in Path(f"/proc/{started.pid}/stat").read_bytes():
        assert time.monotonic() < deadline, "the launcher outlived its standby"
        time.sleep(0.02)
    os.close(write)
    os.close(read)
