"""Lightning Fabric: ``Fabric(accelerator="cpu", precision="16-mixed" | "bf16-mixed")``.

Per step, as Fabric's documentation writes it: forward through the set-up module (Fabric
puts its autocast there), ``fabric.backward(loss)``, ``fabric.clip_gradients(model,
optimizer, max_norm=...)`` (unscales first when there is a scaler; its default
``error_if_nonfinite=True`` reads the norm on the host), ``optimizer.step()``,
``scheduler.step()``, ``optimizer.zero_grad()``.

Measured, not assumed: Fabric 2.x refuses fp16 AMP on a CPU and switches to
``bf16-mixed`` with a warning; the activation probe and the captured warning say so.
"""

from __future__ import annotations

import warnings

import torch
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

#: Fabric's name for each benchmark precision.
FABRIC_PRECISION = {"fp16": "16-mixed", "bf16": "bf16-mixed"}


class FabricRunner:
    """The Fabric loop; ``info`` records the precision plugin Fabric really chose.

    Raises:
        NotInstalledError: ``lightning`` is not importable.
    """

    def __init__(self, work: Workload) -> None:
        try:
            import lightning
            from lightning.fabric import Fabric
        except ImportError as exc:
            raise NotInstalledError("lightning is not installed") from exc
        self.work = work
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.fabric = Fabric(accelerator="cpu", devices=1, precision=FABRIC_PRECISION[work.precision])
            model = make_model(work)
            self._probe = ActivationProbe(model)
            optimizer = peer_optimizer(model, work)
            compiled = torch.compile(model) if work.compile else model  # Fabric's recipe: compile, then set up
            self.model, self.optimizer = self.fabric.setup(compiled, optimizer)
        self.scheduler = peer_scheduler(optimizer, work)
        plugin = self.fabric._precision
        scaler = getattr(plugin, "scaler", None)
        self.info = PeerInfo(
            label="Lightning Fabric",
            requested=f"{work.precision} ({FABRIC_PRECISION[work.precision]})",
            loss_scaling="dynamic (torch.amp.GradScaler)" if scaler is not None else "none",
            optimizer="torch.optim.AdamW(fused=True) in _FabricOptimizer",
            lr_on_skip="advanced (user's scheduler.step)" if scaler is not None else "n/a (no skips)",
            version=f"lightning {lightning.__version__}, plugin {type(plugin).__name__}"
            f"({getattr(plugin, 'precision', '?')})",
            notes=[str(w.message) for w in caught],
        )

    def step(self, batch: Batch) -> None:
        """One Fabric step on ``batch`` (mean cross-entropy)."""
        logits = self.model(batch.inputs)
        loss = F.cross_entropy(logits.float(), batch.targets)
        self.fabric.backward(loss)
        self.fabric.clip_gradients(self.model, self.optimizer, max_norm=self.work.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.info.compute_dtype == "unknown" and self._probe.dtype is not None:
            self.info.compute_dtype = self._probe.name

    def maybe_flush(self) -> bool:
        """Nothing is logged."""
        return False

    def close(self) -> None:
        """Nothing to release."""
