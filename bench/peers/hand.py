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

from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from bench.peers.base import PeerInfo
from bench.workload import (
    ActivationProbe,
    BenchPrecision,
    OptimizerSettings,
    Workload,
    make_model,
    peer_optimizer,
    peer_scheduler,
)
from trainer.data import Batch

#: ``loss_of(forward, batch)``: the float32 mean loss of one micro-batch; ``forward`` is the model or,
#: with ``compile``, what ``torch.compile`` made of it (typed a plain callable).
LossOf = Callable[[Callable[..., Any], Batch], torch.Tensor]


class HandSettings(OptimizerSettings, Protocol):
    """What the loop needs beyond the optimizer settings (:class:`Workload`, ``LoraWorkload``)."""

    # read-only (properties): the workloads are frozen
    @property
    def precision(self) -> BenchPrecision: ...
    @property
    def max_grad_norm(self) -> float: ...
    @property
    def compile(self) -> bool: ...
    @property
    def autocast_dtype(self) -> torch.dtype | None: ...


def classification_loss(model: Callable[..., Any], batch: Batch) -> torch.Tensor:
    """Mean cross-entropy of the MLP's logits (computed in float32)."""
    return F.cross_entropy(model(batch.inputs).float(), batch.targets)


def hand_peer(work: Workload) -> HandLoop:
    """The hand loop on the MLP workload of :mod:`bench.workload`."""
    return HandLoop(make_model(work), work, classification_loss)


class HandLoop:
    """The hand-written loop on CPU around ``model``; ``info.compute_dtype`` is filled by the first step.

    ``loss_of`` runs the forward (under autocast) and returns the float32 mean loss.
    """

    def __init__(self, model: nn.Module, work: HandSettings, loss_of: LossOf, *, version: str = "") -> None:
        self.work = work
        self.model = model
        self._forward = torch.compile(model) if work.compile else model
        self.loss_of = loss_of
        self.optimizer = peer_optimizer(self.model, work)
        self.scheduler = peer_scheduler(self.optimizer, work)
        self.scaling = work.precision == "fp16"
        self.scaler = torch.amp.GradScaler("cpu", enabled=self.scaling)
        self._last_scale = self.scaler.get_scale() if self.scaling else 1.0
        self._probe = ActivationProbe(self.model)
        self._parameters = [p for p in model.parameters() if p.requires_grad]
        self.info = PeerInfo(
            label="hand-written loop",
            requested=work.precision,
            loss_scaling="dynamic (torch.amp.GradScaler)" if self.scaling else "none",
            optimizer="torch.optim.AdamW(fused=True)",
            lr_on_skip="not advanced (host reads the scale)" if self.scaling else "n/a (no skips)",
            version=version or f"torch {torch.__version__}",
        )

    def step(self, batch: Batch) -> None:
        """One AMP step on ``batch``: autocast forward, scaled backward, unscale, clip, step, update."""
        dtype = self.work.autocast_dtype
        with torch.autocast(device_type="cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = self.loss_of(self._forward, batch)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self._parameters, self.work.max_grad_norm)
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
