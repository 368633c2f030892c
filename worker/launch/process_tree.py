"""Starting and stopping one torchrun process tree (docs/architecture.md, "The run directory").

torchrun is started in a new session, so it leads its own session and process
group. torchrun in turn starts every rank in a session of its own, so the run is
tracked as a process tree (:class:`ProcessTree`: the leader's session, every
descendant, and the sessions they lead), and :meth:`RunProcess.stop` stops all of it
(celery#1106, pytorch PR #113231: signalling only the pool process, or only
torchrun, leaves ranks behind). It stops torchrun the way torchrun expects: SIGTERM
to torchrun, which passes it on to its ranks and waits for them; the ranks' own
groups get SIGTERM only when torchrun is gone or has not stopped them soon. torchrun
runs through :mod:`worker.launch.torchrun`, so such a stop ends it without a crash report.
``--standalone`` makes torchrun pick a free rendezvous port, so two runs on one host
never collide (pytorch#126510). The child gets a minimal environment: never the
database or broker URLs. The run is started through :mod:`worker.launch.deathsig`, so it
gets SIGTERM when the worker dies, even by SIGKILL.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from halfcast.contracts.rundir import RunDir
from halfcast.contracts.spec import JobSpec
from halfcast.core.settings import Settings
from trainer.registered import REGISTRY_DIR_ENV
from trainer.startup import LAUNCHED_AT_ENV
from worker.launch.exits import wait_for_exit

log = logging.getLogger(__name__)

#: The module torchrun runs as: torchrun's own ``main``, ended by a stop signal without a traceback.
LAUNCHER = "worker.launch.torchrun"
#: The module each rank starts through: it puts the rank's output in its own log file.
RANK_WRAPPER = "worker.launch.rank_output"
#: torchrun's variable for how long, after passing a stop signal on, it waits for its ranks before SIGKILL.
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
#: Environment variables passed through to the run when the worker has them.
#: The run's niceness (``Settings.run_nice``), set by :func:`build_environment`, applied by :func:`start_run`.
RUN_NICE_ENV = "HALFCAST_RUN_NICE"
PASSTHROUGH_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "USER", "LOGNAME")
#: Seconds to wait for the session to empty after SIGKILL before giving up.
KILL_WAIT_S = 10.0
#: Seconds torchrun gets to stop its ranks before the worker signals their groups itself (at most the grace
#: period). A rank that gets SIGTERM from both sees one stop: the trainer's handler only sets a flag.
FORWARD_WAIT_S = 1.0
#: Longest wait between two scans of the run's processes while waiting for them to exit (a scan adopts
#: processes started meanwhile; ``tick`` is called after each). An exit ends the wait at once (:mod:`worker.launch.exits`).
WAIT_STEP_S = 0.25


def build_command(spec: JobSpec, spec_path: Path, run_dir: Path, module: str = "trainer") -> list[str]:
    """The torchrun command line for one attempt (``ranks_per_node`` ranks on this host; a one-node job's world).

    A node of a multi-node job launches :func:`worker.gang.launch.gang_command` instead.

    torchrun runs through :mod:`worker.launch.torchrun` (torchrun's arguments, torchrun's
    ``main``). Each rank runs ``module`` through :mod:`worker.launch.rank_output`, which keeps the
    rank's stdout and stderr in ``<run_dir>/logs/rank-<r>.log`` (:mod:`halfcast.contracts.rundir`).
    """
    return [
        sys.executable, "-m", LAUNCHER,
        "--standalone", "--nnodes", "1", "--nproc-per-node", str(spec.ranks_per_node),
        "-m", RANK_WRAPPER, str(RunDir(run_dir).logs), module, "--spec", str(spec_path), "--run-dir", str(run_dir),
    ]  # fmt: skip  # one row per group of torchrun's flags, each flag beside its value


def project_root() -> Path:
    """The directory that holds the ``trainer`` package (the child's ``PYTHONPATH``)."""
    found = importlib.util.find_spec("trainer")
    if found is None or not found.submodule_search_locations:
        raise RuntimeError("the trainer package cannot be found")
    return Path(next(iter(found.submodule_search_locations))).resolve().parent


def build_environment(
    spec: JobSpec, settings: Settings, base: Mapping[str, str] | None = None, *, gpus: Sequence[int] = ()
) -> dict[str, str]:
    """A minimal environment for the run, built from ``base`` (default: this process's).

    Holds ``PATH``, ``HOME``, ``LANG`` and friends, ``PYTHONPATH`` (so ``trainer``
    imports), ``PYTHONUNBUFFERED``, ``OMP_NUM_THREADS`` (the CPUs shared among the
    ranks), ``HALFCAST_DATA_ROOTS`` and ``HALFCAST_MODEL_ROOTS`` (``os.pathsep``-joined),
    ``HALFCAST_REGISTRY_DIR`` (registered datasets and models: :mod:`trainer.registered`),
    :data:`RUN_NICE_ENV` (``HALFCAST_RUN_NICE``: the niceness :func:`start_run` gives the run) and
    ``CUDA_VISIBLE_DEVICES``: exactly ``gpus``, the host indices allocated to the
    attempt (:mod:`worker.resources.gpu_locks`), or empty for a CPU job (it sees no GPU), and
    ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``: ``HALFCAST_CANCEL_GRACE_S`` rounded up, how long
    torchrun waits for its ranks after passing SIGTERM on before it SIGKILLs them (the
    worker's own SIGKILL comes at the grace; torchrun's matters once the worker is gone,
    :mod:`worker.launch.deathsig`). Never the database or broker URLs. Raises ``ValueError``
    when ``gpus`` does not hold exactly ``spec.gpus`` distinct devices.
    """
    base = os.environ if base is None else base
    env = {name: base[name] for name in PASSTHROUGH_ENV if name in base}
    env["PYTHONPATH"] = os.pathsep.join(_python_path(base))
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = str(rank_threads(spec, settings.worker_concurrency))
    env[RUN_NICE_ENV] = str(settings.run_nice)
    env["HALFCAST_DATA_ROOTS"] = _joined(settings.data_roots)
    env["HALFCAST_MODEL_ROOTS"] = _joined(settings.model_roots)
    env[SHUTDOWN_TIMEOUT_ENV] = str(math.ceil(settings.cancel_grace_s))
    env[REGISTRY_DIR_ENV] = str(settings.registry_dir)
    if settings.allow_faults:
        env["HALFCAST_ALLOW_FAULTS"] = "1"
    if len(set(gpus)) != spec.gpus or len(gpus) != spec.gpus:
        raise ValueError(f"the job needs {spec.gpus} GPU(s) but was given {list(gpus)}")
    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    return env


def _joined(roots: Sequence[Path]) -> str:
    """Absolute root directories, ``os.pathsep``-joined (the trainer's :class:`trainer.roots.RootSet` format)."""
    return os.pathsep.join(str(Path(root).expanduser().resolve()) for root in roots)


def _python_path(base: Mapping[str, str]) -> list[str]:
    entries = [str(project_root())]
    entries += [entry for entry in base.get("PYTHONPATH", "").split(os.pathsep) if entry and entry not in entries]
    return entries


def rank_threads(spec: JobSpec, cpu_slots: int, cpus: int | None = None) -> int:
    """Intra-op threads per rank: a CPU job's share of the host is one of the worker's ``cpu_slots`` (its
    concurrency), so jobs side by side never ask for more threads than the host has cores; a GPU job's
    ranks share every core (it holds no CPU slot). At least one."""
    cpus = _cpu_count() if cpus is None else cpus
    share = cpus // max(1, cpu_slots) if spec.gpus == 0 else cpus
    return max(1, share // spec.ranks_per_node)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ProcInfo:
    """One process as seen in ``/proc/<pid>/stat``."""

    pid: int
    ppid: int
    state: str
    pgid: int
    sid: int
    start: int  # start time in clock ticks since boot: tells a reused pid apart

    @property
    def alive(self) -> bool:
        """False for zombies and dead entries (exited, only waiting to be reaped)."""
        return self.state not in ("Z", "X", "x")


#: Enough bytes for any ``/proc/<pid>/stat`` (52 numbers and a command name of at most 64 bytes).
PROC_STAT_BYTES = 2048


def read_proc(pid: int | str) -> ProcInfo | None:
    """Parse ``/proc/<pid>/stat``; ``None`` if the process is gone.

    With ``os.open`` and ``os.read`` on bytes, not ``Path.read_text``: the worker scans every
    process on the host each poll of a run (:meth:`ProcessTree.refresh`), and this reads a
    host's table in a third of the time.
    """
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    try:
        stat = os.read(fd, PROC_STAT_BYTES)
    except ProcessLookupError:  # exited between the open and the read
        return None
    finally:
        os.close(fd)
    fields = stat.rsplit(b")", 1)[1].split()  # the command name may hold spaces and ')'
    return ProcInfo(int(pid), int(fields[1]), fields[0].decode(), int(fields[2]), int(fields[3]), int(fields[19]))


def process_table() -> dict[int, ProcInfo]:
    """Every process in ``/proc`` by pid."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (info := read_proc(entry)) is not None:
            table[info.pid] = info
    return table


def session_members(sid: int) -> list[ProcInfo]:
    """Every live (non-zombie) process whose session id or process group id is ``sid``."""
    return [info for info in process_table().values() if info.alive and sid in (info.sid, info.pgid)]


class ProcessTree:
    """The processes of one run, remembered across scans of ``/proc``.

    A run is its leader's session and process group, every descendant of a member,
    and every session or group such a descendant leads: torchrun starts each rank
    in a session of its own, so the leader's session alone misses the ranks, and
    once torchrun dies its orphaned ranks are no longer its children. Scanning
    while the run is alive records them, so they can still be found and killed.
    """

    def __init__(self, leader: int) -> None:
        self.leader = leader
        info = read_proc(leader)
        self.known: dict[int, int] = {leader: info.start} if info is not None else {}

    def refresh(self) -> list[ProcInfo]:
        """Rescan ``/proc``; return the run's live processes (the leader included while alive)."""
        table = process_table()
        self.known = {pid: start for pid, start in self.known.items() if _same_live(table.get(pid), start)}
        while added := self._adopt(table):
            self.known.update(added)
        return [table[pid] for pid in self.known]

    def _adopt(self, table: dict[int, ProcInfo]) -> dict[int, int]:
        """Live processes not yet known that belong to the run by parent, session or group."""
        owners = {self.leader}
        for pid in self.known:
            owners.update((table[pid].sid, table[pid].pgid))
        return {
            info.pid: info.start
            for info in table.values()
            if info.alive
            and info.pid not in self.known
            and (info.ppid in self.known or info.sid in owners or info.pgid in owners)
        }


def _same_live(info: ProcInfo | None, start: int) -> bool:
    return info is not None and info.alive and info.start == start


class Leader(Protocol):
    """What a run's leader must offer: a started ``subprocess.Popen`` (torchrun), or a launcher a warm
    standby forked (:class:`worker.warm.forked.ForkedLauncher`)."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...


class RunProcess:
    """A started run's leader (torchrun, or a warm launcher: the leader of its own session) and its process tree."""

    def __init__(self, popen: Leader, log_path: Path) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.log_path = log_path
        self.tree = ProcessTree(popen.pid)

    def poll(self) -> int | None:
        """The leader's exit status (negative: killed by that signal), or ``None`` while it runs.

        Also rescans the run's processes, so ranks orphaned later are still known.
        """
        self.tree.refresh()
        return self.popen.poll()

    @property
    def returncode(self) -> int | None:
        """The exit status once :meth:`poll` or :meth:`stop` saw the exit."""
        return self.popen.returncode

    def members(self) -> list[ProcInfo]:
        """The run's live processes (see :class:`ProcessTree`)."""
        return self.tree.refresh()

    def stop(self, grace_s: float, tick: Callable[[], object] | None = None) -> bool:
        """Stop the whole run; return ``True`` once no process of it is left.

        1. SIGTERM to the leader alone: torchrun passes it on to every rank, waits for
           them to checkpoint and exit, and exits (:mod:`worker.launch.torchrun`).
        2. Once the leader has exited with processes of the run left (orphaned ranks), or
           after :data:`FORWARD_WAIT_S` (at most ``grace_s``), SIGTERM to every other
           process of the run (by process group): the fallback for a launcher that died or
           does not pass it on. A leader still alive gets no second SIGTERM.
        3. ``grace_s`` after the first SIGTERM, SIGKILL likewise, then a check of
           ``/proc`` that nothing of the run is left (zombies aside).

        Every wait ends the moment the last process of the run exits (:func:`worker.launch.exits.wait_for_exit`).
        ``tick`` is called at least every :data:`WAIT_STEP_S` while waiting (the runner renews its lease there).
        """
        started = time.monotonic()
        deadline = started + grace_s
        self._signal_leader(signal.SIGTERM)
        if self._wait_empty(min(deadline, started + FORWARD_WAIT_S), tick, until=self._leader_exited):
            return True
        self._signal(signal.SIGTERM, spare_leader=not self._leader_exited())
        if self._wait_empty(deadline, tick):
            return True
        log.warning("run %d outlived its %.1f s grace period; killing it", self.pid, grace_s)
        self._signal(signal.SIGKILL)
        if self._wait_empty(time.monotonic() + KILL_WAIT_S, tick):
            return True
        left = [info.pid for info in self.members()]
        log.error("run %d: processes %s survived SIGKILL", self.pid, left)
        return False

    def _signal_leader(self, signum: signal.Signals) -> None:
        """Signal the leader alone; nothing once it is reaped (``Popen.send_signal`` checks: its pid may be reused)."""
        self.popen.send_signal(signum)

    def _leader_exited(self) -> bool:
        return self.popen.poll() is not None

    def _signal(self, signum: signal.Signals, *, spare_leader: bool = False) -> None:
        """Signal every process group of the run (each member is in one; they all lie in the run's sessions).

        Only the groups of live members: the leader's pid, once reaped, may be reused.
        With ``spare_leader``, the leader's own group is signalled member by member with
        the leader left out: it already has its SIGTERM, and a second one would interrupt
        torchrun's wait for its ranks (its agent would then shut them down a second time).
        """
        members = self.members()
        for pgid in {info.pgid for info in members if not (spare_leader and info.pgid == self.pid)}:
            _ignore_gone(os.killpg, pgid, signum)
        if spare_leader:
            for info in members:
                if info.pgid == self.pid and info.pid != self.pid:
                    _ignore_gone(os.kill, info.pid, signum)

    def _reap(self) -> None:
        """Collect the leader's exit status (it has exited: it is no live member)."""
        try:
            self.popen.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            log.error("run %d: the leader is gone from /proc but could not be reaped", self.pid)

    def _wait_empty(
        self, deadline: float, tick: Callable[[], object] | None = None, until: Callable[[], bool] | None = None
    ) -> bool:
        """Wait until no process of the run is left (``True``, the leader reaped), or until the monotonic
        ``deadline`` passes or ``until()`` holds (``False``)."""
        while True:
            members = self.members()
            if not members:
                self._reap()
                return True
            now = time.monotonic()
            if now >= deadline or (until is not None and until()):
                return False
            if tick is not None:
                tick()
            wait_for_exit([info.pid for info in members], min(deadline - now, WAIT_STEP_S))


def _ignore_gone(kill: Callable[[int, int], None], target: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        kill(target, signum)


def start_run(command: list[str], run_dir: Path, env: Mapping[str, str], pass_fds: Sequence[int] = ()) -> RunProcess:
    """Start ``command`` in ``run_dir`` as the leader of a new session, signalled if the worker dies.

    stdout and stderr go to ``<run_dir>/logs/launcher.log`` (torchrun's own output;
    each rank's goes to its ``rank-<r>.log``, see :func:`build_command`). The
    descriptors ``pass_fds`` (the attempt's GPU locks) are inherited by the command, so
    the locks outlive a worker that dies before its run does. The run starts at the niceness
    its environment's :data:`RUN_NICE_ENV` adds (:mod:`worker.launch.deathsig`). The run's environment also
    gets :data:`trainer.startup.LAUNCHED_AT_ENV`, the unix time of the launch (its start-up
    phases are timed from there). Raises ``OSError`` when the command cannot be started
    (its program is not found or not executable).
    """
    if shutil.which(command[0], path=env.get("PATH")) is None:
        raise FileNotFoundError(f"no executable {command[0]!r}")
    log_path = RunDir(run_dir).launcher_log
    log_path.parent.mkdir(parents=True, exist_ok=True)
    guarded = [*guard_command(_run_nice(env)), *command]
    env = {**env, LAUNCHED_AT_ENV: f"{time.time():.6f}"}
    with log_path.open("ab") as log_file:
        popen = _popen(guarded, run_dir, env, log_file, pass_fds)
    log.info("started run %d in %s: %s", popen.pid, run_dir, " ".join(command))
    return RunProcess(popen, log_path)


def _run_nice(env: Mapping[str, str]) -> int:
    value = env.get(RUN_NICE_ENV, "0")
    return int(value) if value.isdigit() else 0


def guard_command(nice: int = 0) -> list[str]:
    """The prefix that starts a run's first process: :mod:`worker.launch.deathsig` with this process's pid and ``nice``."""
    return [sys.executable, "-m", "worker.launch.deathsig", "--nice", str(nice), str(os.getpid()), "--"]


def _popen(
    command: list[str], cwd: Path, env: Mapping[str, str], log_file: IO[bytes], pass_fds: Sequence[int] = ()
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
        pass_fds=tuple(pass_fds),
    )


def log_tail(path: Path, lines: int = 50, max_bytes: int = 64 << 10) -> str:
    """The last ``lines`` lines of a log file (at most its last ``max_bytes``); ``""`` if absent."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])
