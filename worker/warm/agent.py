"""The launcher a standby forks for each run: fork the job's ranks and supervise them as torchrun does.

Each rank is a fork of the launcher (a fork of the standby: torch and the trainer imported) in a session
of its own, with torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``TORCHELASTIC_*``), its output in
``logs/rank-<r>.log`` (:func:`worker.launch.rank_output.redirect_output`), ``torch.set_num_threads``
from ``OMP_NUM_THREADS`` (read by OpenMP when the standby imported torch, before the job's
value was known) and a process title naming the job's run directory (``ps`` shows which
job a rank runs). As under torchrun, the launcher hosts the ``env://`` rendezvous store
(``TORCHELASTIC_USE_AGENT_STORE``): it binds port 0 itself once the ranks are forked (the
store's thread never sees a fork) and sends each rank the port through a pipe, so two runs
started together never race for a port (C25, pytorch#126510). The supervision follows
torchrun's single-node rules:

* every rank exits 0: the launcher exits 0;
* a rank fails (non-zero exit or a signal): the others get SIGTERM, then SIGKILL after
  ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds; torchrun's "Root Cause" summary goes to
  ``launcher.log`` (the worker reads it, :mod:`worker.lifecycle.failure_logs`) and the launcher exits 1;
* the launcher gets SIGTERM, SIGINT or SIGHUP: it passes it on to every rank's group, waits
  for them as long (then SIGKILL) and exits 128 + the signal number, as :mod:`worker.launch.torchrun` does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from worker.launch.rank_output import redirect_output
from worker.warm.assignment import Assignment, GangSeat

log = logging.getLogger("worker.warm.agent")

#: The signals a launcher passes on to its ranks (torchrun's own set).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: torchrun's variable: seconds the ranks get after a stop signal before SIGKILL.
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
#: The address ranks of a single-node job meet at.
LOCALHOST = "127.0.0.1"
#: Exit status of a run one of whose ranks failed (torchrun's).
FAILED_EXIT = 1
#: Seconds between two checks of the ranks while waiting for them to stop.
STOP_POLL_S = 0.02
#: Seconds a rank already exiting when another failed is waited for, to learn how it ended.
EXITING_WAIT_S = 5.0
#: The kernel's task flag of a process inside ``exit`` (``PF_EXITING``, ``/proc/<pid>/stat`` field 9).
PF_EXITING = 0x4


class Stopped(Exception):
    """The launcher got a stop signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass(frozen=True)
class RankExit:
    """How one rank ended: its global rank, pid and wait status as an exit code (negative: the signal)."""

    rank: int
    pid: int
    exitcode: int
    at: float


RankMain = Callable[[list[str]], int]


def rank_environment(
    base: Mapping[str, str], local_rank: int, processes: int, run_id: str, gang: GangSeat | None = None
) -> dict[str, str]:
    """torchrun's environment for local rank ``local_rank`` of ``processes`` on its node (``MASTER_PORT`` comes later).

    On one node (``gang`` ``None``) the global rank is the local one and the ranks meet on the loopback
    address; as node ``gang.node_rank`` of a gang, global ranks ``node_rank * processes`` onwards and the
    ranks meet at node 0's rendezvous endpoint, as torchrun's static rendezvous gives them.
    """
    node_rank = gang.node_rank if gang else 0
    world_size = str(processes * (gang.nodes if gang else 1))
    rank = str(node_rank * processes + local_rank)
    return {
        **base,
        "RANK": rank, "LOCAL_RANK": str(local_rank), "GROUP_RANK": str(node_rank), "ROLE_RANK": rank,
        "WORLD_SIZE": world_size, "LOCAL_WORLD_SIZE": str(processes), "ROLE_WORLD_SIZE": world_size,
        "ROLE_NAME": "default", "MASTER_ADDR": gang.endpoint_host if gang else LOCALHOST,
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": gang.run_id if gang else run_id,
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
    }  # fmt: skip  # one row per group of torchrun's variables


def set_title(title: str) -> None:
    """The process title ``ps`` and ``/proc/<pid>/cmdline`` show (setproctitle; unchanged where it is missing)."""
    try:
        from setproctitle import setproctitle
    except ImportError:
        return
    setproctitle(title)


def run(assignment: Assignment, rank_main: RankMain) -> int:
    """Fork the assignment's ranks, supervise them, return the launcher's exit status (see the module)."""
    stops: list[int] = []
    _handle_stops(stops, raising=True)
    run_id = f"warm-{os.getpid()}"
    ranks: dict[int, int] = {}
    ports: list[int] = []
    failure: RankExit | None = None
    try:
        for local_rank in range(assignment.processes):
            env = rank_environment(assignment.env, local_rank, assignment.processes, run_id, assignment.gang)
            ports.append(_fork_rank(assignment, assignment.first_rank + local_rank, env, rank_main, ranks))
        store = _rendezvous(ports, assignment)
        set_title(f"halfcast-launcher (warm) {_launcher_flags(assignment)} MASTER_PORT={store.port}")
        failure = _wait_all(ranks)
    except Stopped:
        pass
    _handle_stops(stops, raising=False)  # a second signal while stopping only is noted
    if stops:
        log.warning("stopped by %s: passing it on to the ranks", signal.Signals(stops[0]).name)
        _stop_ranks(ranks, signal.Signals(stops[0]), _shutdown_timeout(assignment.env))
        return 128 + stops[0]
    if failure is None:
        return 0
    _stop_ranks(ranks, signal.SIGTERM, _shutdown_timeout(assignment.env))
    sys.stderr.write(root_cause_report(failure, assignment.first_rank))
    return FAILED_EXIT


def _handle_stops(stops: list[int], *, raising: bool) -> None:
    """Note each stop signal in ``stops``; with ``raising``, the first also raises :class:`Stopped`."""

    def stop(signum: int, _frame: FrameType | None) -> None:
        stops.append(signum)
        if raising and len(stops) == 1:
            raise Stopped(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)


def _shutdown_timeout(env: Mapping[str, str]) -> float:
    try:
        return max(0.0, float(env.get(SHUTDOWN_TIMEOUT_ENV, "30")))
    except ValueError:
        return 30.0


@dataclass(frozen=True)
class Rendezvous:
    """The port this node's ranks meet at, and the store the launcher hosts there (``None``: another node's)."""

    port: int
    store: Any = None


def _rendezvous(port_pipes: list[int], assignment: Assignment) -> Rendezvous:
    """Send every rank the rendezvous port (:func:`_host_store`'s, or node 0's endpoint on another node of a gang)."""
    gang = assignment.gang
    if gang is not None and gang.node_rank != 0:
        meeting = Rendezvous(gang.endpoint_port)
    else:
        try:
            meeting = _host_store(assignment)
        except (RuntimeError, OSError) as exc:  # torch's DistNetworkError is a RuntimeError
            log.error("the rendezvous store could not be started: %s", exc)
            meeting = Rendezvous(0)
    for fd in port_pipes:
        with contextlib.suppress(OSError):  # that rank is gone already: its exit is seen by the wait
            if meeting.port:  # no port: the ranks read none and fail, and the launcher reports it
                os.write(fd, f"{meeting.port}\n".encode())
        os.close(fd)
    return meeting


def _host_store(assignment: Assignment) -> Rendezvous:
    """The ``env://`` store: on one node, at a port the kernel picks; on node 0 of a gang, at the gang's endpoint."""
    from torch.distributed import TCPStore

    gang = assignment.gang
    host, port = (gang.endpoint_host, gang.endpoint_port) if gang else (LOCALHOST, 0)
    store = TCPStore(host, port, assignment.world_size, is_master=True, wait_for_workers=False)
    return Rendezvous(store.port, store)


def _launcher_flags(assignment: Assignment) -> str:
    """torchrun's flags the launcher stands for, for its process title."""
    gang = assignment.gang
    nodes = f"--nnodes {gang.nodes} --node-rank {gang.node_rank} " if gang else ""
    return f"{nodes}--nproc-per-node {assignment.processes} --run-dir {assignment.run_dir}"


def _fork_rank(
    assignment: Assignment, rank: int, env: dict[str, str], rank_main: RankMain, ranks: dict[int, int]
) -> int:
    """Fork rank ``rank`` into ``ranks`` (pid -> rank); the write end of its port pipe. The child never returns.

    Stop signals are blocked from the fork until the child is in ``ranks``, so a stop
    reaches every rank that was started.
    """
    read_end, write_end = os.pipe()
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        pid = os.fork()
        if pid == 0:  # the child: never returns into the launcher's code
            os.close(write_end)
            os._exit(_run_rank(assignment, rank, env, rank_main, read_end))
        ranks[pid] = rank
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    os.close(read_end)
    return write_end


def _read_port(fd: int) -> str:
    """The store's port, from the launcher (``OSError`` when the launcher ended first)."""
    with os.fdopen(fd, "rb") as pipe:
        line = pipe.readline().strip()
    if not line.isdigit():
        raise OSError("the launcher ended before it sent the rendezvous port")
    return line.decode()


def _run_rank(assignment: Assignment, rank: int, env: dict[str, str], rank_main: RankMain, port_fd: int) -> int:
    """The rank's body in the forked child: its session, environment, log, threads, port, then the trainer."""
    try:
        os.setsid()
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        os.environ.clear()
        os.environ.update(env)
        redirect_output(assignment.logs_dir, rank)
        _note_start(rank)
        _set_threads(env)
        os.environ["MASTER_PORT"] = _read_port(port_fd)
        sys.argv = ["python -m trainer", *assignment.trainer_args]
        set_title(
            f"halfcast-rank {rank}/{assignment.world_size} (warm) python -m trainer "
            f"{' '.join(assignment.trainer_args)} MASTER_PORT={os.environ['MASTER_PORT']}"
        )
        status = rank_main(list(assignment.trainer_args))
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # noqa: BLE001  # what an uncaught exception does to a Python: its traceback, status 1
        traceback.print_exc()
        status = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    return status


def _note_start(rank: int) -> None:
    from trainer.startup import RANK_STARTED_AT_ENV

    now = time.time()
    os.environ[RANK_STARTED_AT_ENV] = f"{now:.6f}"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
    sys.stderr.write(
        f"{stamp} rank{rank} INFO worker.warm.agent: start-up: forked from a warm standby (imports done)\n"
    )


def _set_threads(env: Mapping[str, str]) -> None:
    import torch

    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _exitcode(status: int) -> int:
    """A wait status as Popen reports it: the exit code, or minus the signal."""
    return os.waitstatus_to_exitcode(status)


def _wait_all(ranks: dict[int, int]) -> RankExit | None:
    """Wait for every rank; the first that failed (the rest still running), or ``None`` when all exited 0.

    When the first failure reaped is found with other ranks dead or dying beside it, the order ``waitpid``
    gives is not the order they failed in: a rank killed by a signal (a fault, the OOM killer) closes its
    sockets before its parent can reap it, and under load a peer may exit with an error and be reaped in
    that gap. A rank killed by a signal is then the cause, not one that exited with an error after losing
    its peer; a rank still inside ``exit`` is waited for (:func:`_exiting_failures`) to learn which it was.
    """
    left = dict(ranks)
    while left:
        pid, status = os.waitpid(-1, 0)
        if pid not in left:
            continue
        ended = RankExit(left.pop(pid), pid, _exitcode(status), time.time())
        if ended.exitcode != 0:
            failures = [ended, *_failed_already(left)]
            if ended.exitcode > 0:
                failures += _exiting_failures(left, EXITING_WAIT_S)
            ranks.clear()
            ranks.update(left)
            return next((failure for failure in failures if failure.exitcode < 0), ended)
    ranks.clear()
    return None


def _failed_already(left: dict[int, int]) -> list[RankExit]:
    """Reap, without waiting, the ranks of ``left`` that have already exited; those that failed."""
    failed = []
    while left:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        if pid in left:
            ended = RankExit(left.pop(pid), pid, _exitcode(status), time.time())
            failed += [ended] if ended.exitcode != 0 else []
    return failed


def _is_exiting(pid: int) -> bool:
    """Whether process ``pid`` is inside ``exit`` (a zombie, or tearing down after a signal); False if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session tty tpgid flags ...
    return bool(int(fields[6]) & PF_EXITING)


def _exiting_failures(left: dict[int, int], timeout_s: float) -> list[RankExit]:
    """Reap the ranks of ``left`` already inside ``exit``, waiting up to ``timeout_s`` for each; those that failed."""
    failed = []
    deadline = time.monotonic() + timeout_s
    for pid in [pid for pid in left if _is_exiting(pid)]:
        while time.monotonic() < deadline:
            reaped, status = os.waitpid(pid, os.WNOHANG)
            if reaped == pid:
                ended = RankExit(left.pop(pid), pid, _exitcode(status), time.time())
                failed += [ended] if ended.exitcode != 0 else []
                break
            time.sleep(STOP_POLL_S)
    return failed


def _stop_ranks(ranks: dict[int, int], signum: signal.Signals, timeout_s: float) -> None:
    """``signum`` to each live rank's group, then SIGKILL once ``timeout_s`` has passed; reap them all."""
    for signal_now in (signum, signal.SIGKILL):
        for pid in list(ranks):
            _signal_group(pid, signal_now)
        deadline = time.monotonic() + (timeout_s if signal_now == signum else 10.0)
        while ranks and time.monotonic() < deadline:
            _reap(ranks)
            if ranks:
                time.sleep(STOP_POLL_S)
        if not ranks:
            return
        log.warning("ranks %s outlived %.1f s after %s: killing them", sorted(ranks.values()), timeout_s, signum.name)


def _reap(ranks: dict[int, int]) -> None:
    while ranks:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            ranks.clear()
            return
        if pid == 0:
            return
        ranks.pop(pid, None)


def _signal_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def root_cause_report(failure: RankExit, first_rank: int = 0) -> str:
    """torchrun's failure summary for ``failure`` (the part :mod:`worker.lifecycle.failure_logs` reads)."""
    when = time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(failure.at))
    return (
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        f"  time      : {when}\n"
        f"  host      : {socket.gethostname()}\n"
        f"  rank      : {failure.rank} (local_rank: {failure.rank - first_rank})\n"
        f"  exitcode  : {failure.exitcode} (pid: {failure.pid})\n"
    )
