"""A graceful stop on SIGTERM: every rank agrees, then the loop checkpoints and exits.

The worker stops a run (cancel, deadline, worker shutdown) by sending SIGTERM to
torchrun, which passes it on to every rank (:meth:`worker.launch.process_tree.RunProcess.stop`),
and sends SIGKILL after ``HALFCAST_CANCEL_GRACE_S``. The trainer uses that grace
period: the signal handler only sets a flag; the loop checks it after every optimizer
step and, once the ranks agree, writes the pending records and a checkpoint of that
step, then exits with :data:`STOPPED_EXIT` (128 + SIGTERM, what an untrapped SIGTERM
gives) at once, without the interpreter's teardown (:func:`exit_now`). A retried
attempt resumes from that checkpoint instead of the last periodic one, so a stop loses
at most the step in flight.

Agreement: the ranks can see the signal at different steps (it reaches them one by
one), and the checkpoint is a collective, so a rank must stop only at a step where
every rank stops. With more than one rank, the flags are max-reduced after every step
on a gloo group over host memory: no device synchronisation (on CUDA the default group
is NCCL, so a gloo group is created for this), a few tens of microseconds per step
on one host. One rank: the flag is read directly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from types import FrameType
from typing import NoReturn

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

#: Exit status of a run stopped by SIGTERM after its checkpoint (128 + 15).
STOPPED_EXIT = 128 + signal.SIGTERM


def exit_now(status: int) -> NoReturn:
    """Flush the logs and the standard streams, then end the process with ``status`` without the interpreter's teardown.

    For a process whose work is done and on disk (the stop checkpoint written, the
    records flushed and their file closed, the process group left): tearing down an
    interpreter that imported torch takes about a second, several on a busy host, and
    the worker waits for every process of the run to exit before it reports the stop.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream: nothing left to flush
            stream.flush()
    os._exit(status)


class StopRequested(Exception):
    """Raised by the loop after the stop checkpoint; ``step`` is the last step done."""

    def __init__(self, step: int) -> None:
        super().__init__(f"stopped by SIGTERM after step {step} (checkpoint written)")
        self.step = step


class StopSignal:
    """A SIGTERM flag that every rank agrees on.

    Call :meth:`install` in the main thread of each rank (not at import); then
    :meth:`agreed` after every optimizer step, on every rank at the same steps.
    """

    def __init__(self) -> None:
        self.received = False
        self._group: dist.ProcessGroup | None = None
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._previous: signal.Handlers | object | None = None

    def install(self) -> StopSignal:
        """Trap SIGTERM (repeated signals change nothing) and build the agreement group if distributed."""
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            default_is_gloo = dist.get_backend() == "gloo"
            self._group = dist.group.WORLD if default_is_gloo else dist.new_group(backend="gloo")
        return self

    def restore(self) -> None:
        """Put back the SIGTERM handler :meth:`install` replaced (for tests and embedding)."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)  # type: ignore[arg-type]
            self._previous = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.received:
            log.warning("SIGTERM received: checkpointing after the current step, then exiting")
        self.received = True

    def agreed(self) -> bool:
        """True when some rank received SIGTERM (a collective over the gloo group when distributed)."""
        if self._group is None:
            return self.received
        self._flag.fill_(int(self.received))
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group)
        return bool(self._flag.item())  # a host tensor: no device synchronisation
