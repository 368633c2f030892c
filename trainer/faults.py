"""Test-only fault injection from ``spec.faults`` (off when it is ``None``).

The API accepts a ``faults`` block only with ``HALFCAST_ALLOW_FAULTS=1``, and the
trainer's entry point refuses one unless its worker passed ``HALFCAST_ALLOW_FAULTS=1``;
this module obeys whatever the spec holds.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterable

import torch

from halfcast.contracts.spec import FaultsSpec
from trainer.parallel.sharded import local_tensor

log = logging.getLogger(__name__)


class FaultInjector:
    """Injects the faults of ``faults`` on rank ``rank``; every method is a no-op without faults.

    ``precision``: the precision the run computes in (after a bf16 fallback, ``bf16``),
    matched against ``faults.nonfinite_grad_precisions``; ``None`` matches any.
    """

    def __init__(self, faults: FaultsSpec | None, rank: int, precision: str | None = None) -> None:
        self.faults = faults
        self.rank = rank
        self.precision = precision
        self._steps = frozenset(faults.nonfinite_grad_steps) if faults is not None else frozenset()

    def _nonfinite_at(self, step: int) -> bool:
        """Whether ``step`` is in ``nonfinite_grad_steps`` or at or after ``nonfinite_grad_from_step``."""
        start = self.faults.nonfinite_grad_from_step if self.faults is not None else None
        return step in self._steps or (start is not None and step >= start)

    def at_step_start(self, step: int) -> None:
        """Before attempted step ``step``: sleep ``sleep_per_step_s``; kill this process with
        ``kill_at_step.signal`` on ``kill_at_step.rank``; raise ``RuntimeError`` at
        ``raise_at_step`` (on every rank).
        """
        faults = self.faults
        if faults is None:
            return
        if faults.sleep_per_step_s > 0.0:
            time.sleep(faults.sleep_per_step_s)
        kill = faults.kill_at_step
        if kill is not None and kill.step == step and kill.rank == self.rank:
            log.warning("fault injection: sending %s to myself at step %d", kill.signal, step)
            os.kill(os.getpid(), getattr(signal, kill.signal))
        if faults.raise_at_step == step:
            raise RuntimeError(f"fault injection: raise_at_step {step}")

    def after_backward(self, step: int, parameters: Iterable[torch.Tensor]) -> None:
        """After the last backward of ``step`` (after DDP's all-reduce): if ``step`` is in
        ``nonfinite_grad_steps`` or at or after ``nonfinite_grad_from_step``, this rank is in
        ``ranks`` (default all) and the run's precision
        is in ``nonfinite_grad_precisions`` (default any), set element 0
        of the first existing parameter gradient to ``+inf`` or ``nan``.
        """
        faults = self.faults
        if faults is None or not self._nonfinite_at(step):
            return
        if faults.ranks is not None and self.rank not in faults.ranks:
            return
        only = faults.nonfinite_grad_precisions
        if only is not None and self.precision is not None and self.precision not in only:
            return
        # This rank's part only (a DTensor's local shard under FSDP2; empty shards skipped).
        grad = next((g for g in (local_tensor(p.grad) for p in parameters if p.grad is not None) if g.numel()), None)
        if grad is None:
            return
        value = float("inf") if faults.nonfinite_value == "inf" else float("nan")
        with torch.no_grad():
            grad.view(-1)[0] = value
        log.warning("fault injection: gradient element set to %s at step %d", value, step)
