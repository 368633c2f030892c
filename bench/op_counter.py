"""Count the aten operators a block dispatches: the host's share of a step, independent of timing.

:class:`OpCounter` is a ``TorchDispatchMode``: every aten operator that reaches the Python
dispatch key while it is active is counted once, by name (an operator's own inner calls run
below the mode and are not counted again). Forward, autograd's backward (run on the calling
thread on CPU) and the optimizer's kernels all count, so ``total`` per step is the number of
operator launches the host pays for: on a GPU, kernels launched; on a CPU, dispatcher round
trips. Views and factory calls count like any other operator.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCounter"]


class OpCounter(TorchDispatchMode):
    """Context manager: ``counts`` maps each aten overload name to its calls while active."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    @property
    def total(self) -> int:
        """Operators dispatched so far."""
        return sum(self.counts.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        """Count ``func`` and run it unchanged."""
        self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))
