"""Two forked "ranks" whose failures ``waitpid`` reports out of order: used by the warm agent's tests.

Rank 1 (the victim) is inside ``exit`` first and stays there: its main thread has ended
(``pthread_exit``: the kernel keeps the process, a group leader, until its last thread ends) and a
second thread SIGKILLs the process ``LINGER_S`` later, as a rank killed by a signal under load is
still tearing down, its sockets closed, when its peer notices. Rank 0 (the peer) starts only once
rank 1 is inside ``exit`` and exits 1 at once, as a rank that lost its peer does. So rank 0 can be
reaped first, and rank 1's SIGKILL is the root cause. Prints ``<rank> <exitcode>`` of the failure
:func:`worker.warm.agent._wait_all` names.
"""

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from worker.warm.agent import _is_exiting, _wait_all

LINGER_S = 1.0


def _victim() -> None:
    def kill_later() -> None:
        time.sleep(LINGER_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=kill_later).start()
    ctypes.CDLL(None).pthread_exit(None)  # the main thread ends; the process lives on in the other


def _fork(child: Callable[[], object]) -> int:
    pid = os.fork()
    if pid == 0:
        child()
        os._exit(0)
    return pid


if __name__ == "__main__":
    victim = _fork(_victim)
    deadline = time.monotonic() + 10.0
    while not _is_exiting(victim) and time.monotonic() < deadline:
        time.sleep(0.01)
    peer = _fork(lambda: os._exit(1))
    failure = _wait_all({peer: 0, victim: 1})
    sys.stdout.write(f"{failure.rank} {failure.exitcode}\n" if failure else "none\n")
