"""A worker's slots: CPU jobs up to its concurrency, GPU jobs up to its free GPUs.

A CPU job (``gpus`` 0) takes one of ``concurrency`` CPU slots of this worker
process; a GPU job takes exactly ``gpus`` of the worker's devices through the
host-wide lock files of :mod:`worker.resources.gpu_locks` and no CPU slot. A
:class:`Placement` holds what it took until :meth:`Placement.release`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Self

from worker.resources.gpu_locks import GpuLease, GpuLocks


def _nothing() -> None:
    return None


class Placement:
    """The slot one job holds: its GPU indices (empty for a CPU job) and how to give them back."""

    def __init__(
        self, gpus: tuple[int, ...] = (), release: Callable[[], None] = _nothing, lock_fds: tuple[int, ...] = ()
    ) -> None:
        self.gpus = gpus
        self.lock_fds = lock_fds
        self._release: Callable[[], None] | None = release

    def release(self) -> None:
        """Give the slot back (idempotent)."""
        release, self._release = self._release, None
        if release is not None:
            release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


class Slots:
    """CPU slots (per process) and GPU locks (per host) of one worker."""

    def __init__(self, concurrency: int, gpu_locks: GpuLocks) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self.concurrency = concurrency
        self.gpu_locks = gpu_locks
        self._cpu_busy = 0
        self._lock = threading.Lock()

    @property
    def gpus(self) -> tuple[int, ...]:
        """The worker's GPU indices."""
        return self.gpu_locks.gpus

    @property
    def threads(self) -> int:
        """Jobs the worker can run at once: its CPU slots plus one per GPU."""
        return self.concurrency + len(self.gpus)

    def can_ever_place(self, gpus: int) -> bool:
        """Whether a job asking for ``gpus`` devices fits this worker when it is idle."""
        return gpus <= len(self.gpus)

    def try_place(self, gpus: int) -> Placement | None:
        """Take a slot for a job with ``gpus`` devices (0: a CPU slot) now, or ``None`` if none is free.

        Raises ``OSError`` when the GPU lock files cannot be opened.
        """
        if gpus <= 0:
            return self._try_cpu()
        lease: GpuLease | None = self.gpu_locks.try_acquire(gpus)
        return None if lease is None else Placement(lease.gpus, lease.release, lease.descriptors)

    def _try_cpu(self) -> Placement | None:
        with self._lock:
            if self._cpu_busy >= self.concurrency:
                return None
            self._cpu_busy += 1
        return Placement((), self._free_cpu)

    def _free_cpu(self) -> None:
        with self._lock:
            self._cpu_busy -= 1
