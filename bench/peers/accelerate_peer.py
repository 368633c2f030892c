"""Hugging Face Accelerate: ``Accelerator(mixed_precision=<precision>)`` on the CPU.

Per step, as Accelerate's documentation writes it: ``accelerator.backward(loss)``,
``accelerator.clip_grad_norm_`` (which unscales first when there is a scaler),
``optimizer.step()``, ``scheduler.step()`` (its ``AcceleratedScheduler`` does not advance
on a step the scaler skipped), ``optimizer.zero_grad()``. The forward pass runs through
the prepared model (Accelerate puts its autocast there).

Measured, not assumed: with ``mixed_precision="fp16"`` on a CPU, Accelerate 1.x creates
no ``GradScaler`` and no autocast, and trains in float32, without a warning. The
activation probe reports what really ran, and the report says so.
"""

from __future__ import annotations

import warnings

import torch.nn.functional as F

from bench.peers.base import NotInstalledError, PeerInfo
from bench.workload import (
    ActivationProbe,
    Workload,
    make_model,
    peer_optimizer,
    peer_scheduler,
)
from trainer.data import Batch


class AccelerateRunner:
    """The Accelerate loop; ``info`` records the scaler and compute dtype Accelerate really used.

    Raises:
        NotInstalledError: ``accelerate`` is not importable.
    """

    def __init__(self, work: Workload) -> None:
        try:
            import accelerate
        except ImportError as exc:
            raise NotInstalledError("accelerate is not installed") from exc
        self.work = work
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.accelerator = accelerate.Accelerator(
                mixed_precision=work.precision, cpu=True, dynamo_backend="inductor" if work.compile else "no"
            )
            model = make_model(work)
            self._probe = ActivationProbe(model)
            optimizer = peer_optimizer(model, work)
            prepared = self.accelerator.prepare(model, optimizer, peer_scheduler(optimizer, work))
        self.model, self.optimizer, self.scheduler = prepared
        scaler = self.accelerator.scaler
        self.info = PeerInfo(
            label="Accelerate",
            requested=work.precision,
            loss_scaling="dynamic (torch.amp.GradScaler)" if scaler is not None else "none (no GradScaler created)",
            optimizer="torch.optim.AdamW(fused=True) in AcceleratedOptimizer",
            lr_on_skip="not advanced (host reads the scale)" if scaler is not None else "n/a (no skips)",
            version=f"accelerate {accelerate.__version__}",
            notes=[str(w.message) for w in caught],
        )

    def step(self, batch: Batch) -> None:
        """One Accelerate step on ``batch`` (mean cross-entropy)."""
        logits = self.model(batch.inputs)
        loss = F.cross_entropy(logits.float(), batch.targets)
        self.accelerator.backward(loss)
        self.accelerator.clip_grad_norm_(self.model.parameters(), self.work.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.info.compute_dtype == "unknown" and self._probe.dtype is not None:
            self.info.compute_dtype = self._probe.name

    def maybe_flush(self) -> bool:
        """Nothing is logged."""
        return False

    def close(self) -> None:
        """Release Accelerate's references to the model and optimizer."""
        self.accelerator.free_memory()
