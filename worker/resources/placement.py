"""Waiting for a slot before a job is claimed: the worker never claims a job it cannot place.

A task first reads the job: if it is no longer ``queued`` the message is dropped.
Otherwise the task waits, polling every ``HALFCAST_WORKER_POLL_INTERVAL_S``, for
the slot the job needs (:mod:`worker.resources.slots`), while the job stays ``queued`` and
its message unacknowledged. If no slot frees up within
``HALFCAST_WORKER_SLOT_WAIT_S``, or the worker shuts down, it raises
:class:`SlotUnavailable` and the task hands the message back to the queue (a new
message at the tail), so another worker, or a job that fits, gets its turn: a
worker whose slots are busy does not sit on jobs that others could run. A job
cancelled while waiting is dropped at the next poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from worker.resources.slots import Placement, Slots

log = logging.getLogger(__name__)


class SlotUnavailable(RuntimeError):
    """No slot for the job freed up in time (or the worker is shutting down): hand the message back."""


#: Reads a job's GPU count while it is ``queued``; ``None`` once it is not (or does not exist).
QueuedGpus = Callable[[str], int | None]


class Placer:
    """Finds a slot for a queued job on this worker, waiting up to ``wait_s`` seconds for one."""

    def __init__(
        self, slots: Slots, queued_gpus: QueuedGpus, wait_s: float, poll_s: float, stop: threading.Event
    ) -> None:
        self.slots = slots
        self.queued_gpus = queued_gpus
        self.wait_s = wait_s
        self.poll_s = poll_s
        self.stop = stop

    def place(self, job_id: str) -> Placement | None:
        """A slot for ``job_id``; ``None`` when the job is not ``queued`` (drop its message).

        Raises :class:`SlotUnavailable` when none frees up within ``wait_s`` or the
        worker is shutting down; database errors propagate (the task retries).
        """
        deadline = time.monotonic() + self.wait_s
        needed = self.queued_gpus(job_id)
        if needed is not None and not self.slots.can_ever_place(needed):
            log.info(
                "job %s needs %d GPUs; this worker has %d: leaving it to another worker",
                job_id,
                needed,
                len(self.slots.gpus),
            )
        while needed is not None:
            if self.stop.is_set():
                raise SlotUnavailable(f"job {job_id}: the worker is shutting down")
            placement = self.slots.try_place(needed)
            if placement is not None:
                return placement
            if time.monotonic() >= deadline:
                raise SlotUnavailable(f"job {job_id}: no slot for {_what(needed)} freed up in {self.wait_s:.1f} s")
            self.stop.wait(self.poll_s)
            needed = self.queued_gpus(job_id)
        return None


def _what(gpus: int) -> str:
    return f"{gpus} GPU(s)" if gpus > 0 else "a CPU job"
