"""``python -m worker.warm.standby``: a Python with torch and the trainer imported that forks each run's launcher.

Started by :class:`worker.warm.pool.WarmPool` in a session of its own (through
:mod:`worker.launch.deathsig`) and with ``CUDA_VISIBLE_DEVICES`` empty: it only ever runs CPU
jobs and never initialises CUDA, so forking it is safe. It imports what every rank
imports (:data:`PRELOAD`; :data:`OPTIONAL_PRELOAD` where installed: the digits dataset's
scikit-learn, transformers and PEFT for hf models), checks that it is still a single
thread (a fork copies only the calling thread), writes :data:`READY` on stdout, then
serves: each :class:`~worker.warm.assignment.Assignment` (a JSON line on stdin) gets a
forked child that takes the run's directory and environment, puts its output in
``launcher.log`` and becomes the run's launcher (:func:`worker.warm.agent.run`), while
the standby waits for the next one (:mod:`worker.warm.forkserver`). So every CPU run a
worker starts is warm, one after another or several at once, and the imports are paid
once per worker, not once per run. End of input (the worker let it go) ends it with
status 0 once the launchers it forked have exited.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from worker.warm.agent import set_title
from worker.warm.assignment import Assignment
from worker.warm.forkserver import ForkServer

log = logging.getLogger("worker.warm.standby")

#: What every rank imports: torch, its process groups and the trainer's entry point.
PRELOAD = ("torch", "torch.distributed", "trainer.__main__", "trainer.data.builders", "trainer.models")
#: What some ranks import, where it is installed (an optional extra missing is no error).
OPTIONAL_PRELOAD = (
    "setproctitle", "sklearn.datasets", "sklearn.model_selection", "trainer.data.digits",
    "transformers", "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
    "peft", "trainer.hf.loading", "trainer.hf.adapters", "trainer.hf.build", "trainer.data.jsonl.build",
)  # fmt: skip  # groups: titles and the digits dataset, transformers, Halfcast's hf modules
#: The line a standby writes once it is ready.
READY = b"ready\n"
#: Exit status when the preload leaves threads running (the standby would not be safe to fork).
NOT_FORK_SAFE_EXIT = 70


def preload(required: Sequence[str] = PRELOAD, optional: Sequence[str] = OPTIONAL_PRELOAD) -> list[str]:
    """Import ``required`` (errors propagate) and what of ``optional`` imports; the names imported."""
    done = [importlib.import_module(name).__name__ for name in required]
    for name in optional:
        try:
            done.append(importlib.import_module(name).__name__)
        except ImportError:
            log.info("warm standby: %s is not installed; ranks that need it import it themselves", name)
    return done


def os_threads() -> int:
    """The threads of this process as the kernel counts them (Python's and native ones)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def take_over(assignment: Assignment) -> None:
    """Become the run's process: its directory, its environment, its launcher log on fds 1 and 2."""
    os.chdir(assignment.run_dir)
    os.environ.clear()
    os.environ.update(assignment.env)
    assignment.launcher_log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(assignment.launcher_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
        os.close(null)


def launch(assignment: Assignment) -> NoReturn:
    """The forked launcher's body: run the assignment's ranks (the trainer imported by the preload), then end."""
    from trainer.__main__ import main as trainer_main
    from trainer.preemption import exit_now
    from worker.warm.agent import run

    exit_now(run(assignment, trainer_main))


def main(argv: Sequence[str] | None = None) -> int:
    """Preload, report ready, then fork a launcher for each assignment until end of input."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s", stream=sys.stderr)
    preload()
    # setproctitle finds the title's memory through the environment on its first call: before the run's replaces it
    set_title("halfcast-standby (warm: torch and the trainer imported, waiting for a run)")
    if (threads := os_threads()) != 1:
        log.error("warm standby: %d threads after the imports; a fork would copy only one", threads)
        return NOT_FORK_SAFE_EXIT
    os.write(1, READY)
    return ForkServer(launch, take_over).serve()


if __name__ == "__main__":
    from trainer.preemption import exit_now

    exit_now(main(sys.argv[1:]))
