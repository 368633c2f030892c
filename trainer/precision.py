"""Precision policies: one narrow interface for fp32, bf16, fp16 and fp8.

The training loop uses only :class:`PrecisionPolicy`: ``prepare_model`` once,
``autocast()`` around the forward pass, ``backward(loss)`` per micro-batch, and
``step(optimizer, parameters, max_grad_norm)`` once per optimizer step. Master
weights, gradients and optimizer state stay float32 in every precision; autocast
runs eligible ops in the compute dtype. (The interface follows the shape of
Lightning Fabric's precision plugins; the step logic is DESIGN.md §4.)

A step, at the accumulation boundary: unscale the gradients once; find non-finite
values (the fused unscale kernel plus the finiteness of the global gradient norm);
max-reduce the flag across ranks when a process group exists, so every rank makes
the same decision; clip the *unscaled* gradients; then step the optimizer or skip it,
and update the loss scale. A non-finite gradient is never applied, in any precision.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from trainer.loss_scale import DynamicLossScaler, LossScaler, NoOpLossScaler, StaticLossScaler
from trainer.spec import JobSpec, LossScaleSpec

log = logging.getLogger(__name__)

#: Compute capability needed for fp8 tensor cores (Ada / Hopper and newer).
FP8_MIN_CAPABILITY = (8, 9)

_COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}


class PrecisionUnsupportedError(RuntimeError):
    """The requested precision cannot run on this device (typed reason ``precision_unsupported``)."""


@dataclass(frozen=True)
class StepOutcome:
    """What happened at one optimizer step.

    Attributes:
        applied: the optimizer stepped.
        overflow: non-finite gradients were found on some rank; the update was skipped.
        loss_scale: the scale used for this step's backward passes (1.0 without scaling).
        grad_norm: global L2 norm of the unscaled gradients before clipping; ``None`` when skipped.
        skipped_steps: skipped steps so far, this one included.
    """

    applied: bool
    overflow: bool
    loss_scale: float
    grad_norm: float | None
    skipped_steps: int


class PrecisionPolicy:
    """Autocast, loss scaling and step-or-skip for one precision on one device.

    Args:
        name: ``fp32``, ``bf16``, ``fp16`` or ``fp8``.
        device: the device the model and gradients live on.
        scaler: the loss scaler (no-op for everything but fp16).
    """

    def __init__(self, name: str, device: torch.device, scaler: LossScaler) -> None:
        self.name = name
        self.device = device
        self.compute_dtype = _COMPUTE_DTYPES[name]
        self.scaler = scaler
        self.skipped_steps = 0
        self.fp8_layers: list[str] = []

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Adapt ``model`` to the precision before wrapping (fp8 converts eligible Linears)."""
        if self.name == "fp8":
            self.fp8_layers = _convert_to_fp8(model)
        return model

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Context for the forward pass: autocast to the compute dtype (nothing for fp32)."""
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    def backward(self, loss: Tensor) -> None:
        """Backward of ``loss`` (0-d) multiplied by the current loss scale."""
        self.scaler.scale_loss(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, parameters: Sequence[Tensor], max_grad_norm: float | None) -> StepOutcome:
        """Unscale, check, agree across ranks, clip, then step or skip; update the scale.

        Makes one host synchronisation (reading the flag, scale and norm together).
        The caller zeroes the gradients afterwards and advances the LR schedule only
        when ``applied`` is true.
        """
        grads = [p.grad for p in parameters if p.grad is not None]
        scale_used = self.scaler.scale.clone()
        found_inf = self.scaler.unscale_(grads)
        norm = _total_norm(grads, self.device)
        found_inf = torch.maximum(found_inf, (~torch.isfinite(norm)).float())
        _max_across_ranks(found_inf)
        if max_grad_norm is not None and grads:
            torch.nn.utils.clip_grads_with_norm_(parameters, max_grad_norm, norm)
        flag, scale, norm_value = torch.stack([found_inf, scale_used, norm]).tolist()
        overflow = flag > 0.0
        if overflow:
            self.skipped_steps += 1
        else:
            optimizer.step()
        self.scaler.update(found_inf)
        return StepOutcome(
            applied=not overflow,
            overflow=overflow,
            loss_scale=scale,
            grad_norm=None if overflow else norm_value,
            skipped_steps=self.skipped_steps,
        )

    @property
    def loss_scale(self) -> float:
        """The current loss scale (syncs the host; for logging and tests)."""
        return self.scaler.scale.item()

    def state_dict(self) -> dict[str, Any]:
        """Precision name, scaler state (scale and trackers) and the skipped-step counter."""
        return {"precision": self.name, "scaler": self.scaler.state_dict(), "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore exactly what :meth:`state_dict` saved.

        Raises:
            ValueError: if the checkpoint was written by another precision.
        """
        if state["precision"] != self.name:
            raise ValueError(f"checkpoint precision {state['precision']!r} differs from the job's {self.name!r}")
        self.scaler.load_state_dict(state["scaler"])
        self.skipped_steps = int(state["skipped_steps"])


def _total_norm(grads: Sequence[Tensor], device: torch.device) -> Tensor:
    """Global L2 norm of ``grads`` as a 0-d float32 tensor on ``device`` (0 if there are none)."""
    if not grads:
        return torch.zeros((), dtype=torch.float32, device=device)
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0, error_if_nonfinite=False).float().to(device)


def _max_across_ranks(flag: Tensor) -> None:
    """Max-reduce ``flag`` in place over the default process group, if there is one."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)


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
    return PrecisionPolicy(spec.precision, device, build_scaler(spec.effective_loss_scale, device))


def _convert_to_fp8(model: nn.Module) -> list[str]:
    """Swap eligible ``nn.Linear`` layers for torchao float8 training layers; return their names.

    Kept in bf16: the first and last Linear (most sensitive to quantisation) and any
    Linear whose dimensions are not multiples of 16 (fp8 GEMM requirement).
    """
    from torchao.float8 import convert_to_float8_training

    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    keep = set(linears[:1] + linears[-1:])

    def eligible(module: nn.Module, fqn: str) -> bool:
        return (
            isinstance(module, nn.Linear)
            and fqn not in keep
            and module.in_features % 16 == 0
            and module.out_features % 16 == 0
        )

    chosen = [name for name in linears if eligible(model.get_submodule(name), name)]
    convert_to_float8_training(model, module_filter_fn=eligible)
    log.info("fp8: %d of %d Linear layers converted: %s", len(chosen), len(linears), chosen)
    return chosen
