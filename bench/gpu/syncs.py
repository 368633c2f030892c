"""Host syncs per steady step: asserted for Halfcast, counted for the hand loop.

On CUDA, Halfcast's steps run under ``torch.cuda.set_sync_debug_mode("error")`` (any
synchronising call raises); the hand loop's run under ``"warn"``, each warning counted (its
syncs are reported, not refused: a GradScaler loop may make some). Warnings raised in
autograd's backward threads may escape the count, so the hand loop's figure is a lower bound.
On the CPU (dry run) both are counted with :class:`trainer.sync_counter.HostSyncCounter`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch

from trainer.sync_counter import HostSyncCounter

#: The text of CUDA's sync warning (``c10::cuda::warn_or_error_on_sync``).
SYNC_WARNING = "called a synchronizing CUDA operation"


@contextmanager
def cuda_sync_mode(mode: str) -> Iterator[None]:
    """CUDA's sync debug mode ``mode`` (``"error"`` or ``"warn"``) while active, then ``"default"``."""
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


class SyncGuard:
    """The context of each steady step; ``strict``: syncs raise on CUDA (Halfcast), else they are counted."""

    def __init__(self, device: torch.device, *, strict: bool) -> None:
        self.cuda = device.type == "cuda"
        self.strict = strict
        self.counts: list[int] = []

    def around_step(self) -> AbstractContextManager[Any]:
        """The context for one steady-state step."""
        if self.cuda:
            return cuda_sync_mode("error") if self.strict else self._warned()
        return self._counted()

    @contextmanager
    def _counted(self) -> Iterator[None]:
        with HostSyncCounter() as counter:
            yield
        self.counts.append(counter.total)

    @contextmanager
    def _warned(self) -> Iterator[None]:
        with warnings.catch_warnings(record=True) as caught, cuda_sync_mode("warn"):
            warnings.simplefilter("always")
            yield
        self.counts.append(sum(SYNC_WARNING in str(w.message) for w in caught))

    @property
    def method(self) -> str:
        """How syncs were checked."""
        if not self.cuda:
            return "HostSyncCounter (CPU dry run)"
        return 'torch.cuda.set_sync_debug_mode("error")' if self.strict else 'set_sync_debug_mode("warn"), counted'

    @property
    def clean(self) -> bool:
        """No counted sync (on CUDA in strict mode a sync has already raised)."""
        return all(count == 0 for count in self.counts)


def synchronize(device: torch.device) -> None:
    """Wait for the device (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
