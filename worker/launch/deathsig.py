"""``python -m worker.launch.deathsig [--nice N] PARENT_PID -- COMMAND...``: run COMMAND, signalled when its parent dies.

The worker launches every run through this wrapper. It asks the kernel
(``prctl(PR_SET_PDEATHSIG)``, Linux) to send it SIGTERM when the thread that
started it ends, checks that its parent is still ``PARENT_PID`` (else the worker
died before the request took effect, and it exits), then replaces itself with
COMMAND (same pid, same session; the request survives ``exec``). So when a worker is
killed with SIGKILL, torchrun gets SIGTERM and stops its ranks, instead of training
on, orphaned, beside the attempt that the reaper relaunches. Elsewhere than Linux it
only runs COMMAND. With ``--nice N`` it first adds ``N`` to its niceness, which COMMAND and
every process it starts inherit (``HALFCAST_RUN_NICE``: a run yields the CPU to the API and
the worker). Imports nothing from the project: it starts in milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

#: ``PR_SET_PDEATHSIG`` from ``<linux/prctl.h>``.
PR_SET_PDEATHSIG = 1
#: The signal the run gets when its worker dies (torchrun then stops its ranks).
DEATH_SIGNAL = signal.SIGTERM
#: Exit status when the parent is already gone.
PARENT_GONE_EXIT = 75


def request_death_signal(signum: int) -> bool:
    """Ask for ``signum`` when the parent thread ends; ``False`` where that is unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


USAGE = "usage: python -m worker.launch.deathsig [--nice N] PARENT_PID -- COMMAND...\n"


def main(argv: Sequence[str]) -> int:
    """Parse ``[--nice N] PARENT_PID -- COMMAND...``, lower the priority, request the death signal, exec COMMAND."""
    argv = list(argv)
    nice = 0
    if argv[:1] == ["--nice"]:
        if len(argv) < 2 or not argv[1].isdigit():
            sys.stderr.write(USAGE)
            return 2
        nice, argv = int(argv[1]), argv[2:]
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        sys.stderr.write(USAGE)
        return 2
    parent, command = int(argv[0]), list(argv[2:])
    if nice:
        os.nice(nice)
    if request_death_signal(DEATH_SIGNAL) and os.getppid() != parent:
        return PARENT_GONE_EXIT
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"cannot run {command[0]}: {exc}\n")
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
