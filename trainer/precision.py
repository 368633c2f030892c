"""Precision policies: one narrow interface for fp32, bf16, fp16 and fp8.

The training loop uses only :class:`PrecisionPolicy`: ``prepare_model`` once,
``autocast()`` around the forward pass, ``backward(loss)`` per micro-batch, and
``step(optimizer, parameters, max_grad_norm)`` once per optimizer step. Master
weights, gradients and optimizer state stay float32 in every precision; autocast
runs eligible ops in the compute dtype. (The interface follows the shape of
Lightning Fabric's precision plugins; the step logic is docs/trainer.md, "Numerics of one
optimizer step".)

A step, at the accumulation boundary: unscale the gradients once; find non-finite
values (the fused unscale kernel plus the finiteness of the global gradient norm);
max-reduce the flag across ranks when a process group exists, so every rank makes
the same decision; clip the *unscaled* gradients; then step the optimizer or skip it,
and update the loss scale. A non-finite gradient is never applied, in any precision.

Everything stays on the device: the overflow flag, the skip decision (the optimizer
receives ``found_inf`` and skips itself, see :mod:`trainer.optimizers`), the scale and
its trackers, and the skipped-step counter. A steady-state step makes no host
synchronisation; :class:`StepOutcome` carries 0-d tensors that the loop gathers into
its step-record buffer (:mod:`trainer.telemetry`) and copies to the host once per
logging interval. NaN is told from infinity by the global gradient norm (NaN iff some
gradient holds a NaN), for the divergence guard's reasons.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from trainer.forensics import agree_across_ranks, nonfinite_kinds
from trainer.fp8 import Fp8LayerReport, Fp8Recipe, convert_to_fp8
from trainer.loss_scale import (
    DynamicLossScaler,
    LossScaler,
    NoOpLossScaler,
    StaticLossScaler,
)
from trainer.sharded import clip_grads_, grad_norms, local_tensors
from trainer.spec import JobSpec, LossScaleSpec
from trainer.underflow import underflow_fraction

log = logging.getLogger(__name__)

#: Compute capability needed for fp8 tensor cores (Ada / Hopper and newer).
FP8_MIN_CAPABILITY = (8, 9)

_COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
#: The dtype each precision computes in (autocast), by precision name.
COMPUTE_DTYPES = _COMPUTE_DTYPES


class PrecisionUnsupportedError(RuntimeError):
    """The requested precision cannot run on this device (typed reason ``precision_unsupported``)."""


@dataclass(frozen=True)
class HostStepOutcome:
    """A :class:`StepOutcome` read on the host (for tests and tools).

    ``grad_norm`` is ``None`` when the step was skipped; ``nan`` is true when some
    rank's gradients held a NaN (not only infinities).
    """

    applied: bool
    overflow: bool
    nan: bool
    loss_scale: float
    grad_norm: float | None
    skipped_steps: int


@dataclass(frozen=True)
class StepOutcome:
    """What happened at one optimizer step, as 0-d tensors on the device (nothing is read on the host).

    Attributes:
        overflow: float32, 1.0 if non-finite gradients were found on some rank and the
            update was skipped, else 0.0 (``bool(outcome.overflow)`` reads it).
        applied: float32, 1.0 if the optimizer applied the update: ``1 - overflow``, and 0.0
            for a window without loss-bearing elements (see :meth:`PrecisionPolicy.step`).
        overflow_kind: float32, 0 clean, 1 only infinities, 2 a NaN was present
            (max over ranks; the divergence guard tells NaN from overflow with it).
        loss_scale: float32, the scale used for this step's backward passes (1.0 without scaling).
        grad_norm: float32, global L2 norm of the unscaled gradients before clipping;
            non-finite on an overflow step.
        skipped_steps: int64, skipped steps so far, this one included.
        underflow_fraction: float32, fraction of gradient values zero or subnormal in
            fp16 before unscaling (:mod:`trainer.underflow`); NaN on steps not sampled.
        rank_kinds: float32 ``[world size]``, per rank the worst kind (0, 1 inf, 2 NaN)
            its gradients held (:mod:`trainer.forensics`).
        param_kinds: float32 ``[P]``, per trainable parameter (model order) the worst
            kind over ranks.
    """

    overflow: Tensor
    applied: Tensor
    overflow_kind: Tensor
    loss_scale: Tensor
    grad_norm: Tensor
    skipped_steps: Tensor
    underflow_fraction: Tensor
    rank_kinds: Tensor
    param_kinds: Tensor

    def to_host(self) -> HostStepOutcome:
        """Read every field with one batched copy (a host synchronisation)."""
        flag, kind, scale, norm, skipped = torch.stack(
            [self.overflow, self.overflow_kind, self.loss_scale, self.grad_norm, self.skipped_steps]
        ).to(torch.float64).tolist()
        overflow = flag > 0.0
        return HostStepOutcome(
            applied=not overflow,
            overflow=overflow,
            nan=kind >= 2.0,
            loss_scale=scale,
            grad_norm=None if overflow else norm,
            skipped_steps=int(skipped),
        )


OverflowSource = Callable[[], Tensor]


class PrecisionPolicy:
    """Autocast, loss scaling and step-or-skip for one precision on one device.

    Args:
        name: ``fp32``, ``bf16``, ``fp16`` or ``fp8``.
        device: the device the model and gradients live on.
        scaler: the loss scaler (no-op for everything but fp16).
    """

    def __init__(self, name: str, device: torch.device, scaler: LossScaler, fp8_recipe: Fp8Recipe = "tensorwise") -> None:
        self.name = name
        self.fp8_recipe: Fp8Recipe = fp8_recipe
        self.fp8_report: list[Fp8LayerReport] = []
        self.device = device
        self.compute_dtype = _COMPUTE_DTYPES[name]
        self.scaler = scaler
        self._skipped = torch.zeros((), dtype=torch.int64, device=device)
        self._overflow_sources: list[OverflowSource] = []
        self._warned_host_skip = False
        self.fp8_layers: list[str] = []
        self._not_sampled = torch.full((), float("nan"), dtype=torch.float32, device=device)

    @property
    def skipped_steps(self) -> Tensor:
        """Skipped steps so far: 0-d int64 on the device."""
        return self._skipped

    def add_overflow_source(self, source: OverflowSource) -> None:
        """Also skip a step when ``source()`` (called once per step, before the decision) is 1.

        ``source`` returns a 0-d float32 flag on the device (1.0 = overflow), e.g. an fp8
        quantisation overflow; it is ORed into the gradients' flag before the cross-rank max.
        """
        self._overflow_sources.append(source)

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Adapt ``model`` to the precision before wrapping.

        fp8: :func:`trainer.fp8.convert_to_fp8` swaps the eligible Linears (torchao on CUDA,
        the emulated Linear elsewhere, for tests: jobs are rejected off CUDA by
        :func:`check_supported`); ``fp8_report`` lists every Linear, ``fp8_layers`` the
        converted ones; an emulated fp8 overflow skips the step like a gradient overflow.
        """
        if self.name == "fp8":
            conversion = convert_to_fp8(model, self.fp8_recipe, emulate=self.device.type != "cuda")
            self.fp8_report = conversion.report
            self.fp8_layers = conversion.fp8_modules
            if conversion.overflow is not None:
                self.add_overflow_source(conversion.overflow.consume)
        return model

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Context for the forward pass: autocast to the compute dtype (nothing for fp32)."""
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    def backward(self, loss: Tensor) -> None:
        """Backward of ``loss`` (0-d) multiplied by the current loss scale."""
        self.scaler.scale_loss(loss).backward()

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        parameters: Sequence[Tensor],
        max_grad_norm: float | None,
        sample_underflow: bool = False,
        no_data: Tensor | None = None,
    ) -> StepOutcome:
        """Unscale, check, agree across ranks, clip, then step or skip on the device; update the scale.

        No host synchronisation for optimizers that follow PyTorch's AMP protocol
        (``_step_supports_amp_scaling``: Halfcast's :mod:`trainer.optimizers`, PyTorch's
        fused ones): they get ``found_inf`` and skip on the device. Any other optimizer
        is stepped after one host read of the flag. The caller zeroes the gradients
        afterwards and advances the LR schedule by ``outcome.applied``.

        With ``sample_underflow`` (fp16: every rank at the same steps), the fraction of
        gradient values that are zero or subnormal in fp16 is measured before
        unscaling (:mod:`trainer.underflow`). The per-parameter and per-rank overflow
        evidence travels in the one cross-rank reduction (:mod:`trainer.forensics`).

        ``no_data`` (0-d bool, the same on every rank): the window held no loss-bearing
        element on any rank, so its (zero) gradient carries nothing to learn. The optimizer
        is then skipped on the device (weights, moments and step counters keep their bits;
        weight decay and momentum do not act), ``applied`` is 0 so the LR schedule holds,
        and the loss scale and its trackers are left; it is not an overflow and not a
        skipped step (``overflow`` 0, ``skipped_steps`` unchanged).
        """
        present = [i for i, p in enumerate(parameters) if p.grad is not None]
        grads = [parameters[i].grad for i in present]
        scale_used = self.scaler.scale  # the scaler replaces, never mutates, its scale tensor
        underflow = underflow_fraction(grads, self.device) if sample_underflow else self._not_sampled
        found = self.scaler.unscale_(local_tensors(grads))
        for source in self._overflow_sources:
            found = torch.maximum(found, source().to(found.device, torch.float32))
        norms = grad_norms(grads, self.device)
        param_kinds = nonfinite_kinds(norms.per_tensor)
        local_kind = torch.maximum(found, param_kinds.max()) if grads else found
        verdict = agree_across_ranks(local_kind, param_kinds, None if len(present) == len(parameters) else present,
                                     len(parameters))
        kind = torch.maximum(verdict.kind, nonfinite_kinds(norms.total))
        found_inf = (kind > 0).float()
        skip = found_inf if no_data is None else torch.maximum(found_inf, no_data.to(found_inf.device, torch.float32))
        if max_grad_norm is not None and grads:
            clip_grads_(grads, max_grad_norm, norms.total)
        self._optimizer_step(optimizer, skip)
        self._skipped = self._skipped + found_inf.long()
        self.scaler.update(found_inf, hold=no_data)
        return StepOutcome(
            overflow=found_inf,
            applied=1.0 - skip,
            overflow_kind=kind,
            loss_scale=scale_used,
            grad_norm=norms.total,
            skipped_steps=self._skipped,
            underflow_fraction=underflow,
            rank_kinds=verdict.rank_kinds,
            param_kinds=verdict.param_kinds,
        )

    def _optimizer_step(self, optimizer: torch.optim.Optimizer, found_inf: Tensor) -> None:
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            optimizer.grad_scale = None  # type: ignore[attr-defined]
            optimizer.found_inf = found_inf  # type: ignore[attr-defined]
            try:
                optimizer.step()
            finally:
                del optimizer.grad_scale, optimizer.found_inf  # type: ignore[attr-defined]
            return
        if not self._warned_host_skip:
            log.warning("%s cannot skip a step on the device: one host read of the overflow flag per step",
                        type(optimizer).__name__)
            self._warned_host_skip = True
        if not bool(found_inf):
            optimizer.step()

    @property
    def loss_scale(self) -> float:
        """The current loss scale (syncs the host; for logging and tests)."""
        return self.scaler.scale.item()

    def state_dict(self) -> dict[str, Any]:
        """Precision name, scaler state (scale and trackers) and the skipped-step counter (python scalars; syncs)."""
        return {"precision": self.name, "scaler": self.scaler.state_dict(), "skipped_steps": int(self._skipped.item())}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore exactly what :meth:`state_dict` saved.

        Raises:
            ValueError: if the checkpoint was written by another precision.
        """
        if state["precision"] != self.name:
            raise ValueError(f"checkpoint precision {state['precision']!r} differs from the job's {self.name!r}")
        self.scaler.load_state_dict(state["scaler"])
        self._skipped = torch.full((), int(state["skipped_steps"]), dtype=torch.int64, device=self.device)


def build_scaler(loss_scale: LossScaleSpec | None, device: torch.device) -> LossScaler:
    """The scaler for a spec's effective loss-scale block (``None`` → no-op)."""
    if loss_scale is None:
        return NoOpLossScaler(device)
    if loss_scale.mode == "static":
        return StaticLossScaler(loss_scale.effective_static_scale, device)
    return DynamicLossScaler(
        init_scale=loss_scale.init_scale,
        growth_factor=loss_scale.growth_factor,
        backoff_factor=loss_scale.backoff_factor,
        growth_interval=loss_scale.growth_interval,
        hysteresis=loss_scale.hysteresis,
        min_scale=loss_scale.min_scale,
        max_scale=loss_scale.max_scale,
        consecutive_hysteresis=loss_scale.consecutive_hysteresis,
        device=device,
    )


def check_supported(precision: str, device: torch.device) -> None:
    """Raise :class:`PrecisionUnsupportedError` if ``precision`` cannot run on ``device``.

    Never falls back to another precision: fp8 needs CUDA with compute capability
    >= 8.9 and torchao; bf16 on CUDA needs hardware bf16 support.
    """
    if precision == "fp8":
        if device.type != "cuda":
            raise PrecisionUnsupportedError(f"fp8 needs a CUDA GPU with compute capability >= 8.9; this rank runs on {device.type}")
        capability = torch.cuda.get_device_capability(device)
        if capability < FP8_MIN_CAPABILITY:
            name = torch.cuda.get_device_name(device)
            raise PrecisionUnsupportedError(f"fp8 needs compute capability >= 8.9; {name} has {capability[0]}.{capability[1]}")
        try:
            import torchao.float8  # noqa: F401
        except ImportError as exc:
            raise PrecisionUnsupportedError("fp8 needs the torchao package on the worker") from exc
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise PrecisionUnsupportedError(f"bf16 is not supported on {torch.cuda.get_device_name(device)}")


def build_precision(spec: JobSpec, device: torch.device) -> PrecisionPolicy:
    """The precision policy a job spec asks for, on ``device``.

    Raises:
        PrecisionUnsupportedError: the precision cannot run on ``device`` (see :func:`check_supported`).
    """
    check_supported(spec.precision, device)
    return PrecisionPolicy(spec.precision, device, build_scaler(spec.effective_loss_scale, device),
                           fp8_recipe=spec.effective_fp8_recipe or "tensorwise")
