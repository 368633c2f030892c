"""The worker's warm standby: one per worker, forking a launcher for each CPU run of the trainer (:mod:`worker.warm`).

:class:`WarmPool` keeps one standby ready. Its own thread starts each standby, so the
standby's death signal (:mod:`worker.launch.deathsig`: it fires when the *thread* that started the
process ends) stays armed as long as the worker runs; that thread outlives the worker's
shutdown until every standby it started has exited. :meth:`WarmPool.start_run` is
:func:`worker.launch.process_tree.start_run` with a warm path: when the command is the trainer's (on one
node, or one node's of a gang with the static rendezvous), the job needs no GPU and a standby is
ready, the standby forks the run's launcher (:mod:`worker.warm.forkserver`; the returned
:class:`~worker.launch.process_tree.RunProcess` supervises and stops it exactly as it does torchrun,
its exit status read from the standby's report) and stays ready for the next run; otherwise the run
starts cold (a node of a warm gang never does: :mod:`worker.gang.plan`). A standby that exits is
replaced; one that fails to start is retried after :data:`RETRY_S`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from halfcast.contracts.rundir import RunDir
from trainer.startup import LAUNCHED_AT_ENV
from worker.launch.process_tree import PASSTHROUGH_ENV, RunProcess, guard_command, project_root, start_run
from worker.warm.assignment import Assignment, LauncherReport, warm_command_parts
from worker.warm.forked import ORPHANED_EXIT, ForkedLauncher
from worker.warm.standby import READY

log = logging.getLogger(__name__)

#: The module a standby runs.
STANDBY_MODULE = "worker.warm.standby"
#: Seconds before starting a standby again after one failed to start.
RETRY_S = 30.0
#: Seconds a ready standby may take to answer an assignment with its launcher's pid.
START_REPLY_S = 30.0
#: Seconds a standby may take to import everything before it is given up.
READY_TIMEOUT_S = 300.0
#: Seconds between two looks at the standby while waiting for it to be ready.
READY_POLL_S = 0.1


def standby_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A standby's environment before it has a run: the pass-through variables, the project's path, no GPU, one thread.

    One OpenMP/BLAS thread keeps the standby a single thread (safe to fork); each rank sets the
    job's own thread count (:func:`worker.warm.agent.rank_environment` and ``torch.set_num_threads``).
    """
    base = os.environ if base is None else base
    env = {name: base[name] for name in PASSTHROUGH_ENV if name in base}
    paths = [str(project_root()), *[p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env.update(
        PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)),
        PYTHONUNBUFFERED="1",
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    return env


class Standby:
    """One started standby and its pipes: ready once it wrote :data:`READY`, then forking a launcher per run.

    After :meth:`wait_ready`, a thread of its own reads the standby's reports
    (:class:`~worker.warm.assignment.LauncherReport`): the pid of each launcher it forked,
    handed back by :meth:`assign`, and each launcher's exit status.
    """

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self._lock = threading.Lock()  # one assignment at a time: its ``started`` report is the next one
        self._started: queue.Queue[ForkedLauncher | None] = queue.Queue()
        self._launchers: dict[int, ForkedLauncher] = {}

    @classmethod
    def start(cls, cwd: Path, nice: int = 0) -> Standby:
        """Start ``python -m worker.warm.standby`` in a session of its own, signalled when this thread's worker dies."""
        command = [*guard_command(nice), sys.executable, "-m", STANDBY_MODULE]
        popen = subprocess.Popen(
            command,
            cwd=cwd,
            env=standby_environment(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        return cls(popen)

    def alive(self) -> bool:
        """Whether the standby process still runs."""
        return self.popen.poll() is None

    def wait_ready(self) -> bool:
        """Block until the standby reports ready (``True``, and its reports are read from then on) or ends (``False``)."""
        assert self.popen.stdout is not None
        if self.popen.stdout.readline() != READY:
            self.popen.stdout.close()
            return False
        threading.Thread(target=self._read_reports, name=f"warm-standby-{self.popen.pid}", daemon=True).start()
        return True

    def assign(self, assignment: Assignment) -> ForkedLauncher | None:
        """Hand over the run; its forked launcher, or ``None`` when the standby is gone or does not answer."""
        assert self.popen.stdin is not None
        with self._lock:
            try:
                self.popen.stdin.write(assignment.model_dump_json().encode() + b"\n")
                self.popen.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                return None
            try:
                return self._started.get(timeout=START_REPLY_S)
            except queue.Empty:
                # a launcher forked later must not run beside the cold run that replaces it: its death signal stops it
                log.error(
                    "warm standby %d did not fork a launcher within %.0f s: killing it", self.popen.pid, START_REPLY_S
                )
                self.popen.kill()
                return None

    def busy(self) -> bool:
        """Whether a launcher it forked has not yet been reported exited."""
        # a copy: the reader thread pops a launcher when its exit is reported
        return any(launcher.returncode is None for launcher in list(self._launchers.values()))

    def release(self) -> None:
        """Let the standby go: end of input ends it once its launchers have (SIGKILL if an idle one lingers)."""
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()
        if self.busy():
            return  # it lives on while its runs do (their death signal); the pool's wind-down waits for it
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()

    def _read_reports(self) -> None:
        assert self.popen.stdout is not None
        with self.popen.stdout:
            for line in self.popen.stdout:
                self._on_report(LauncherReport.model_validate_json(line))
        self._started.put(None)  # an assignment waiting for its launcher gets none: the standby is gone

    def _on_report(self, report: LauncherReport) -> None:
        if report.event == "started":
            launcher = ForkedLauncher(report.pid, self.alive)
            self._launchers[report.pid] = launcher
            self._started.put(launcher)
        elif report.pid in self._launchers:
            self._launchers.pop(report.pid).exited(report.exitcode if report.exitcode is not None else ORPHANED_EXIT)


class WarmPool:
    """Keeps one standby ready and gives it the next run it can take (see the module)."""

    def __init__(self, cwd: Path, shutdown: threading.Event, nice: int = 0) -> None:
        self.cwd = cwd
        self.nice = nice  # the standby's niceness, which its launchers and ranks inherit (``Settings.run_nice``)
        self.shutdown = shutdown
        self._cond = threading.Condition()
        self._ready: Standby | None = None
        self._started: list[Standby] = []
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread that keeps a standby ready (once)."""
        if self._thread is None:
            self.cwd.mkdir(parents=True, exist_ok=True)
            self._thread = threading.Thread(target=self._keep_ready, name="warm-standby", daemon=True)
            self._thread.start()

    def ready(self) -> Standby | None:
        """The standby that takes runs, or ``None`` while none is ready."""
        with self._cond:
            standby = self._ready
        return standby if standby is not None and standby.alive() else None

    def wait_ready(self, timeout_s: float, tick: Callable[[], object]) -> Standby | None:
        """The ready standby, waiting up to ``timeout_s`` while one imports (``tick`` is called on every poll)."""
        deadline = time.monotonic() + timeout_s
        while (standby := self.ready()) is None and time.monotonic() < deadline and not self.shutdown.is_set():
            tick()
            with self._cond:
                self._cond.wait(timeout=READY_POLL_S)
        return standby

    def start_run(
        self,
        command: list[str],
        run_dir: Path,
        env: Mapping[str, str],
        pass_fds: Sequence[int] = (),
        *,
        warm_only: bool = False,
    ) -> RunProcess:
        """:func:`worker.launch.process_tree.start_run`, through the ready standby when the run can take one.

        ``warm_only`` (a node of a warm gang, :mod:`worker.gang.plan`): no cold start; ``OSError`` instead.
        """
        parts = warm_command_parts(command)
        if parts is None or pass_fds or env.get("CUDA_VISIBLE_DEVICES", "") != "":
            return self._cold(command, run_dir, env, pass_fds, "not a CPU run of the trainer", warm_only)
        standby = self.ready()
        if standby is None:
            return self._cold(command, run_dir, env, pass_fds, "no warm standby ready", warm_only)
        run_dir.mkdir(parents=True, exist_ok=True)  # a gang node's own directory is new (start_run makes it too)
        assignment = Assignment(
            run_dir=run_dir,
            logs_dir=parts.logs_dir,
            launcher_log=RunDir(run_dir).launcher_log,
            processes=parts.processes,
            trainer_args=parts.trainer_args,
            env={**env, LAUNCHED_AT_ENV: f"{time.time():.6f}"},
            gang=parts.gang,
        )
        launcher = standby.assign(assignment)
        if launcher is None:
            why = f"the warm standby {standby.popen.pid} did not take the run"
            return self._cold(command, run_dir, env, pass_fds, why, warm_only)
        log.info(
            "started run %d in %s from warm standby %d: %s", launcher.pid, run_dir, standby.popen.pid, " ".join(command)
        )
        return RunProcess(launcher, assignment.launcher_log)

    @staticmethod
    def _cold(
        command: list[str], run_dir: Path, env: Mapping[str, str], pass_fds: Sequence[int], why: str, warm_only: bool
    ) -> RunProcess:
        if warm_only:
            raise OSError(f"{why}, and this run must start warm (its gang launches warm)")
        log.info("%s: starting %s cold", why, run_dir)
        return start_run(command, run_dir, env, pass_fds)

    def _keep_ready(self) -> None:
        while not self.shutdown.is_set():
            with self._cond:
                if self._ready is not None and self._ready.alive():
                    self._cond.wait(timeout=1.0)  # a second to look at the shutdown flag and the standby
                    continue
                if self._ready is not None:
                    log.warning(
                        "warm standby %d exited (status %s): starting another",
                        self._ready.popen.pid,
                        self._ready.popen.returncode,
                    )
                    self._ready = None
            if self.shutdown.is_set():
                break
            standby = self._start_one()
            if standby is None:
                self.shutdown.wait(RETRY_S)
                continue
            with self._cond:
                self._ready = standby
        self._wind_down()

    def _start_one(self) -> Standby | None:
        try:
            standby = Standby.start(self.cwd, self.nice)
        except OSError:
            log.exception("a warm standby could not be started")
            return None
        self._started = [other for other in self._started if other.popen.poll() is None] + [standby]
        if standby.wait_ready():
            log.info("warm standby %d is ready", standby.popen.pid)
            return standby
        log.warning("warm standby %d ended before it was ready (status %s)", standby.popen.pid, standby.popen.wait())
        return None

    def _wind_down(self) -> None:
        """Let the unused standby go; live on while runs started from standbys do (their death signal)."""
        with self._cond:
            ready, self._ready = self._ready, None
        if ready is not None:
            ready.release()
        while any(standby.alive() for standby in self._started):
            time.sleep(1.0)
