"""The reference: a hand-written PyTorch AMP loop (``torch.autocast`` + ``torch.amp.GradScaler``).

Per step, as PyTorch's AMP recipe ("Automatic Mixed Precision examples", gradient
clipping section): autocast forward, ``scaler.scale(loss).backward()``,
``scaler.unscale_``, ``clip_grad_norm_`` of the unscaled gradients, ``scaler.step``,
``scaler.update``. Then the LR schedule advances only if the step was applied, so it
trains exactly what Halfcast trains (a skipped fp16 step must not move the schedule,
pytorch#44511): the loop compares the new scale with the previous one, which reads the
scale on the host (``scaler.get_scale()``: one sync per step). Without that gate the loop
makes no sync with fused AdamW but advances the schedule on skipped steps. bf16 has no
scaler and no skips, so its schedule advances every step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.peers.base import PeerInfo
from bench.workload import (
    ActivationProbe,
    Workload,
    make_model,
    peer_optimizer,
    peer_scheduler,
)
from trainer.data import Batch


class HandLoop:
    """The hand-written loop on CPU; ``info.compute_dtype`` is filled by the first step."""

    def __init__(self, work: Workload) -> None:
        self.work = work
        self.model = make_model(work)
        self.optimizer = peer_optimizer(self.model, work)
        self.scheduler = peer_scheduler(self.optimizer, work)
        self.scaling = work.precision == "fp16"
        self.scaler = torch.amp.GradScaler("cpu", enabled=self.scaling)
        self._last_scale = self.scaler.get_scale() if self.scaling else 1.0
        self._probe = ActivationProbe(self.model)
        self.info = PeerInfo(
            label="hand-written loop", requested=work.precision,
            loss_scaling="dynamic (torch.amp.GradScaler)" if self.scaling else "none",
            optimizer="torch.optim.AdamW(fused=True)",
            lr_on_skip="not advanced (host reads the scale)" if self.scaling else "n/a (no skips)",
            version=f"torch {torch.__version__}",
        )

    def step(self, batch: Batch) -> None:
        """One AMP step on ``batch`` (mean cross-entropy over its samples)."""
        with torch.autocast(device_type="cpu", dtype=self.work.autocast_dtype):
            logits = self.model(batch.inputs)
        loss = F.cross_entropy(logits.float(), batch.targets)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.work.max_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self._advance_schedule()
        self.optimizer.zero_grad(set_to_none=True)
        if self._probe.dtype is not None and self.info.compute_dtype == "unknown":
            self.info.compute_dtype = self._probe.name

    def _advance_schedule(self) -> None:
        """Step the LR schedule unless the scaler backed off (skipped step); one host read with fp16."""
        if not self.scaling:
            self.scheduler.step()
            return
        scale = self.scaler.get_scale()
        if scale >= self._last_scale:
            self.scheduler.step()
        self._last_scale = scale

    def maybe_flush(self) -> bool:
        """Nothing is logged: the leanest possible loop (Halfcast's telemetry is on its side of the ratio)."""
        return False

    def close(self) -> None:
        """Nothing to release."""
