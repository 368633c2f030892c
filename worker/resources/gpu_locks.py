"""Host-wide GPU slots: one lock file per device, held with ``flock`` for a whole attempt.

A GPU is busy while some process holds an exclusive ``flock`` on
``<lock_dir>/gpu-<index>.lock``. ``flock`` locks belong to an open file
description, so two threads of one worker, two pool processes and two workers on
one host (sharing ``lock_dir``) all exclude each other, and the kernel drops the
lock when its holder dies, even by SIGKILL: a crashed worker never leaves a GPU
taken. The run's launcher (torchrun) inherits the descriptors (``pass_fds``, see
:attr:`GpuLease.descriptors`), so a worker that dies while its run still tears down
(its ranks get SIGTERM and checkpoint) leaves the devices locked until that run is
gone too: no other job is placed on a GPU still in use. The worker's own
:meth:`GpuLease.release` unlocks the shared open file description, which frees the
device at once whoever else still holds a descriptor of it.

An allocation takes exactly ``n`` devices or none: it runs under an exclusive lock
on ``<lock_dir>/allocate.lock`` (so two allocations never each take half of what
both need), tries each device without blocking, and gives back what it took if it
found fewer than ``n`` free.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Self

log = logging.getLogger(__name__)


class GpuLease:
    """Devices held by one attempt; :meth:`release` (or leaving the ``with`` block) frees them."""

    def __init__(self, gpus: Sequence[int], descriptors: Sequence[int]) -> None:
        self.gpus: tuple[int, ...] = tuple(gpus)
        self._descriptors = list(descriptors)

    @property
    def descriptors(self) -> tuple[int, ...]:
        """The open, locked descriptors (one per device) for a run to inherit; empty once released."""
        return tuple(self._descriptors)

    def release(self) -> None:
        """Unlock and close every device's lock file (idempotent)."""
        while self._descriptors:
            _unlock(self._descriptors.pop())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


class GpuLocks:
    """The lock files of ``gpus`` (host device indices) under ``lock_dir`` (created on first use)."""

    def __init__(self, lock_dir: Path, gpus: Sequence[int]) -> None:
        self.lock_dir = lock_dir
        self.gpus: tuple[int, ...] = tuple(gpus)

    def path(self, gpu: int) -> Path:
        """The lock file of device ``gpu``."""
        return self.lock_dir / f"gpu-{gpu}.lock"

    def try_acquire(self, count: int) -> GpuLease | None:
        """Lock exactly ``count`` free devices, in list order, or none (``None``); never blocks on a busy device.

        Raises ``ValueError`` for ``count`` < 1 and ``OSError`` when the lock files
        cannot be opened.
        """
        if count < 1:
            raise ValueError(f"a GPU allocation needs at least one device, not {count}")
        if count > len(self.gpus):
            return None
        with self._allocating():
            held: list[tuple[int, int]] = []
            for gpu in self.gpus:
                descriptor = try_lock(self.path(gpu))
                if descriptor is not None:
                    held.append((gpu, descriptor))
                    if len(held) == count:
                        return GpuLease([g for g, _ in held], [d for _, d in held])
            for _, descriptor in held:
                _unlock(descriptor)
        return None

    @contextmanager
    def _allocating(self) -> Iterator[None]:
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.lock_dir / "allocate.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)  # closing the only descriptor drops the lock


def try_lock(path: Path) -> int | None:
    """An open descriptor holding an exclusive lock on ``path``, or ``None`` if someone else holds it."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _unlock(descriptor: int) -> None:
    try:
        fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)
