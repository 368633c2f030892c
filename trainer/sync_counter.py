"""Count host synchronisations (device values read on the host) while a block runs, on any device.

A *host sync* is a point where Python needs a tensor's value, so the host must wait for
the device. :class:`HostSyncCounter` counts two kinds:

* ``scalar_reads``: calls of ``aten::_local_scalar_dense``, the op behind ``.item()``,
  ``float(t)``, ``int(t)``, ``bool(t)`` and ``if t:``, seen by a ``TorchDispatchMode``;
* ``copies``: calls of ``Tensor.tolist``, ``Tensor.numpy`` and ``Tensor.cpu``, counted by
  wrapping those methods while the counter is active (``tolist`` bypasses the
  dispatcher, and a device-to-host copy is a sync even when no scalar is read).

On the CPU nothing actually waits, but the count is exactly what a CUDA run would
wait for, so CPU tests and the benchmark can check "no sync per step" without a GPU.
On CUDA, prefer ``torch.cuda.set_sync_debug_mode("error")`` around the region: it makes
every synchronising call raise, including ones this counter cannot see (e.g.
``torch.nonzero``, ``cudaMemcpy`` of pageable memory, ``tensor.to("cpu")`` inside C++).

The counter patches ``torch.Tensor`` methods globally while active: use it from one
thread at a time, and do not nest it with code that patches the same methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Self

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostSyncCounter"]

#: ``torch.Tensor`` methods that copy a tensor to host memory; each call counts as one copy.
COPY_METHODS = ("tolist", "numpy", "cpu")


class HostSyncCounter(TorchDispatchMode):
    """Context manager counting host reads of tensor values while active.

    Attributes:
        scalar_reads: ``aten::_local_scalar_dense`` calls (``.item()``, ``float(t)``, ``bool(t)``...).
        copies: ``Tensor.tolist`` / ``Tensor.numpy`` / ``Tensor.cpu`` calls.

    Example::

        with HostSyncCounter() as syncs:
            train_step(...)
        assert syncs.total == 0
    """

    WRAPPED = COPY_METHODS

    def __init__(self) -> None:
        super().__init__()
        self.scalar_reads = 0
        self.copies = 0
        self._originals: dict[str, Callable[..., Any]] = {}

    @property
    def total(self) -> int:
        """``scalar_reads + copies``: host syncs seen so far."""
        return self.scalar_reads + self.copies

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        """Count ``_local_scalar_dense`` and run every op unchanged."""
        if func is torch.ops.aten._local_scalar_dense.default:
            self.scalar_reads += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> Self:
        for name in self.WRAPPED:
            original = getattr(torch.Tensor, name)
            self._originals[name] = original
            setattr(torch.Tensor, name, self._counted(original))
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)
        self._originals.clear()

    def _counted(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``original`` wrapped to add one to :attr:`copies` per call."""

        def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.copies += 1
            return original(tensor, *args, **kwargs)

        return counted
