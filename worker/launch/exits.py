"""Waiting for any of a set of processes to exit, without polling where the kernel allows.

The processes of a run are not all the worker's children (torchrun's ranks are
torchrun's), so ``waitpid`` cannot wait for them. A pidfd can: Linux (5.3 and later)
makes ``os.pidfd_open(pid)`` readable when the process exits (a zombie is readable
too), so :func:`wait_for_exit` sleeps in ``poll`` on the pidfds until one is readable
or the timeout passes. Where pidfds are not available (another OS, an older kernel, a
sandbox that refuses the call, no descriptors left) it sleeps :data:`POLL_S` instead
and the caller checks again.

A pid can be reused between the caller's check of ``/proc`` and ``pidfd_open``. The
pidfd then refers to the new process, and the wait lasts until its timeout: the
caller's next check of ``/proc`` sees the old process gone.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Collection

#: Seconds slept instead where pidfds are not available.
POLL_S = 0.05


def wait_for_exit(pids: Collection[int], timeout_s: float) -> None:
    """Return once any process of ``pids`` has exited (or is gone already), or after ``timeout_s`` seconds."""
    if timeout_s <= 0 or not pids:
        return
    if not hasattr(os, "pidfd_open"):
        time.sleep(min(timeout_s, POLL_S))
        return
    fds: list[int] = []
    try:
        for pid in pids:
            fds.append(os.pidfd_open(pid))
    except ProcessLookupError:
        _close(fds)
        return  # one of them is gone already
    except OSError:  # refused, or no descriptors left
        _close(fds)
        time.sleep(min(timeout_s, POLL_S))
        return
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll(timeout_s * 1000)
    finally:
        _close(fds)


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
