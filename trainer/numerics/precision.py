"""Precision policies: fp32 and bf16, fp16 with its loss scaler, fp8 with its converted model.

The training loop uses only the :class:`PrecisionPolicy` interface, after the shape of
Lightning Fabric's precision plugins: ``prepare_model`` once, ``autocast()`` around the
forward pass, ``backward(loss)`` per micro-batch and ``step(...)`` once per optimizer
step. Each precision is a small policy class that owns what only it needs:

=====================  ===========  ==========================================================
policy                 precisions   owns
=====================  ===========  ==========================================================
:class:`PlainPrecision`  fp32, bf16   nothing more: bf16 autocasts, fp32 runs as it is
:class:`Fp16Precision`   fp16         the loss scaler (static or dynamic, :mod:`trainer.numerics.loss_scale`)
:class:`Fp8Precision`    fp8          the model conversion to fp8 Linears (:mod:`trainer.numerics.fp8`)
=====================  ===========  ==========================================================

Master weights, gradients and optimizer state stay float32 in every precision; autocast
runs eligible ops in the compute dtype. :func:`build_precision` is the factory.

A step, at the accumulation boundary, runs five phases (:meth:`PrecisionPolicy.step`):
**unscale and check** (the scaler's fused unscale kernel, any extra overflow source, and
each gradient's norm, whose NaN or infinity marks a non-finite gradient), **agree across
ranks** (one MAX ``all_reduce`` of every rank's verdict, :mod:`trainer.numerics.overflow`),
**clip** the *unscaled* gradients, **apply** (step the optimizer, or skip it on the
device) and **update** (the skipped-step counter and the loss scale). A non-finite
gradient is never applied, in any precision. Overflow forensics and underflow sampling
are optional observers called at defined points (:mod:`trainer.numerics.observers`).

Everything stays on the device: the overflow flag, the skip decision (the optimizer
receives ``found_inf`` and skips itself, see :mod:`trainer.optim.skipping`), the scale and
its trackers, and the skipped-step counter. A steady-state step makes no host
synchronisation; :class:`StepOutcome` carries 0-d tensors that the loop gathers into
its step-record buffer (:mod:`trainer.run.telemetry`) and copies to the host once per
logging interval.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypedDict

import torch
from torch import Tensor, nn

from halfcast.contracts.spec import JobSpec, LossScaleSpec, Precision
from trainer.compiled_clip import CheckFn, compilable, compile_check
from trainer.numerics.forensics import OverflowForensics
from trainer.numerics.fp8 import Fp8LayerReport, Fp8Recipe, convert_to_fp8
from trainer.numerics.loss_scale import (
    DynamicLossScaler,
    LossScaler,
    NoOpLossScaler,
    ScalerState,
    StaticLossScaler,
)
from trainer.numerics.observers import NO_OBSERVERS, Gradients, StepObservers
from trainer.numerics.overflow import agree_across_ranks, is_distributed, nonfinite_flag, nonfinite_kinds
from trainer.numerics.step_outcome import HostStepOutcome, StepOutcome
from trainer.numerics.underflow import UnderflowSampler
from trainer.optim.skipping import DeviceSkipOptimizer
from trainer.parallel.sharded import GradNorms, clip_grads_, grad_norms, local_tensors

__all__ = [
    "COMPUTE_DTYPES",
    "FP8_MIN_CAPABILITY",
    "Fp8Precision",
    "Fp16Precision",
    "HostStepOutcome",
    "PlainPrecision",
    "PrecisionPolicy",
    "PrecisionUnsupportedError",
    "StepOutcome",
    "build_precision",
    "build_scaler",
    "check_supported",
]

log = logging.getLogger(__name__)

#: Compute capability needed for fp8 tensor cores (Ada / Hopper and newer).
FP8_MIN_CAPABILITY = (8, 9)

#: The dtype each precision computes in (autocast), by precision name.
COMPUTE_DTYPES: Mapping[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.bfloat16,
}

#: A 0-d float32 flag on the device (1.0 = overflow), read once per step.
OverflowSource = Callable[[], Tensor]


class PrecisionState(TypedDict):
    """A policy's checkpointed state (a checkpoint's ``precision`` entry, :meth:`PrecisionPolicy.state_dict`)."""

    precision: str
    scaler: ScalerState
    skipped_steps: int
    #: Absent from checkpoints written before it was counted: :func:`trainer.run.checkpoint.load_checkpoint`
    #: reads it as 0.
    empty_windows: int


class PolicyStartFields(TypedDict, total=False):
    """What a policy adds to the ``start`` record: ``fp8_layers`` (the fp8 policy's per-Linear report)."""

    fp8_layers: list[Fp8LayerReport]


class PrecisionUnsupportedError(RuntimeError):
    """The requested precision cannot run on this device (typed reason ``precision_unsupported``)."""


class _Check(NamedTuple):
    """This rank's side of a step: the gradients' norms, their kinds, and the worst kind (with other sources)."""

    norms: GradNorms
    param_kinds: Tensor
    local_kind: Tensor


class _Agreement(NamedTuple):
    """The step's decision input, the same on every rank: the overflow flag and the evidence behind it.

    ``rank_kinds``: each rank's kind from the cross-rank reduction (``None`` for one process);
    ``param_evidence``: per parameter, the agreed kinds, or one process's gradient norms (``None``
    without forensics).
    """

    found_inf: Tensor
    rank_kinds: Tensor | None
    param_evidence: Tensor | None


class PrecisionPolicy(ABC):
    """Autocast, loss scaling and step-or-skip for one precision on one device (the base of the policies).

    Args:
        name: the precision (``fp32``, ``bf16``, ``fp16``, ``fp8``), saved in checkpoints.
        device: the device the model and gradients live on.
        scaler: the loss scaler (the no-op one for every policy but fp16's).
        observers: the step's optional observers (:mod:`trainer.numerics.observers`).
    """

    def __init__(
        self, name: Precision, device: torch.device, scaler: LossScaler, observers: StepObservers = NO_OBSERVERS
    ) -> None:
        self.name = name
        self.device = device
        self.compute_dtype = COMPUTE_DTYPES[name]
        self.scaler = scaler
        self.observers = observers
        self._skipped = torch.zeros((), dtype=torch.float64, device=device)  # float64: one op adds a float32 flag
        self._empty = torch.zeros((), dtype=torch.float64, device=device)  # windows without a loss-bearing element
        self._overflow_sources: list[OverflowSource] = []
        self._warned_host_skip = False
        self._not_sampled = torch.full((), float("nan"), dtype=torch.float32, device=device)
        self._compiled_check: CheckFn | None = None
        self._no_evidence = torch.zeros(0, dtype=torch.float32, device=device)

    # ------------------------------------------------------------------ the interface

    @property
    def fp8_layers(self) -> list[str]:
        """Names of the Linear layers that run in fp8 (none but for :class:`Fp8Precision`)."""
        return []

    @property
    def fp8_report(self) -> list[Fp8LayerReport]:
        """Every Linear and whether it runs in fp8 (empty but for :class:`Fp8Precision`)."""
        return []

    def start_fields(self) -> PolicyStartFields:
        """What the policy adds to the ``start`` record (nothing by default)."""
        return {}

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Adapt ``model`` to the precision before wrapping (unchanged by default)."""
        return model

    @abstractmethod
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Context for the forward pass."""

    def compile_step(self, backend: str = "inductor") -> None:
        """Run a one-process step's check and clip as one compiled graph (:mod:`trainer.compiled_clip`:
        ``compile: true`` on CUDA); compiled at the first step that uses it."""
        self._compiled_check = compile_check(backend)

    def backward(self, loss: Tensor) -> None:
        """Backward of ``loss`` (0-d) multiplied by the current loss scale."""
        self.scaler.scale_loss(loss).backward()

    def add_overflow_source(self, source: OverflowSource) -> None:
        """Also skip a step when ``source()`` (called once per step, before the decision) is 1.

        ``source`` returns a 0-d float32 flag on the device (1.0 = overflow), e.g. an fp8
        quantisation overflow; it is ORed into the gradients' flag before the cross-rank max.
        """
        self._overflow_sources.append(source)

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        parameters: Sequence[Tensor],
        max_grad_norm: float | None,
        *,
        step: int | None = None,
        no_data: Tensor | None = None,
    ) -> StepOutcome:
        """Unscale and check, agree across ranks, clip, apply or skip on the device, update the scale.

        No host synchronisation for optimizers that follow PyTorch's AMP protocol
        (``_step_supports_amp_scaling``: Halfcast's :mod:`trainer.optim.skipping`, PyTorch's
        fused ones): they get ``found_inf`` and skip on the device. Any other optimizer
        is stepped after one host read of the flag. The caller zeroes the gradients
        afterwards and advances the LR schedule by ``outcome.applied``.

        ``step`` (the attempted step, 1-based, the same on every rank) is what the
        observers see: the underflow sampler samples on its multiples of its interval
        (:mod:`trainer.numerics.underflow`); before unscaling, so it sees the values fp16 held. The
        per-parameter overflow evidence travels in the one cross-rank reduction
        (:mod:`trainer.numerics.forensics`).

        ``no_data`` (0-d bool, the same on every rank): the window held no loss-bearing
        element on any rank, so its (zero) gradient carries nothing to learn. The optimizer
        is then skipped on the device (weights, moments and step counters keep their bits;
        weight decay and momentum do not act), ``applied`` is false so the LR schedule holds,
        and the loss scale and its trackers are left; it is not an overflow and not a
        skipped step (``overflow`` 0, ``skipped_steps`` unchanged).
        """
        grads = Gradients.of(parameters)
        scale_used = self.scaler.scale  # the scaler replaces, never mutates, its scale tensor
        underflow = self._not_sampled if self.observers.underflow is None else self._observe_scaled(step, grads)
        if is_distributed():
            check = self._unscale_and_check(grads)
            agreed = self._agree(check, grads)
            norms = check.norms
            clipped = False
        else:
            norms, agreed, clipped = self._check_alone(grads, max_grad_norm)
        found_inf = agreed.found_inf
        skip = found_inf if no_data is None else torch.maximum(found_inf, no_data.to(found_inf.device, torch.float32))
        applied = skip.logical_not()  # skip is 0 or 1
        if not clipped:
            self._clip(grads, norms, max_grad_norm)
        self._apply(optimizer, skip, applied)
        self._update(found_inf, no_data, applied)
        return StepOutcome(
            overflow=found_inf,
            applied=applied,
            loss_scale=scale_used,
            grad_norm=norms.total,
            skipped_steps=self._skipped,
            underflow_fraction=underflow,
            agreed_rank_kinds=agreed.rank_kinds,
            param_evidence=self._no_evidence if agreed.param_evidence is None else agreed.param_evidence,
        )

    @property
    def skipped_steps(self) -> Tensor:
        """Skipped steps so far: 0-d float64 on the device (exact up to 2**53)."""
        return self._skipped

    @property
    def empty_windows(self) -> Tensor:
        """Windows so far without a loss-bearing element on any rank (no update, not skipped): 0-d float64."""
        return self._empty

    @property
    def loss_scale(self) -> float:
        """The current loss scale (syncs the host; for logging and tests)."""
        return self.scaler.scale.item()

    def state_dict(self) -> PrecisionState:
        """Precision name, scaler state (scale and trackers), the skipped-step and empty-window counters (python
        scalars; syncs)."""
        return {
            "precision": self.name,
            "scaler": self.scaler.state_dict(),
            "skipped_steps": int(self._skipped.item()),
            "empty_windows": int(self._empty.item()),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore exactly what :meth:`state_dict` saved.

        Raises:
            ValueError: if the checkpoint was written by another precision.
        """
        if state["precision"] != self.name:
            raise ValueError(f"checkpoint precision {state['precision']!r} differs from the job's {self.name!r}")
        self.scaler.load_state_dict(state["scaler"])
        self._skipped = torch.full((), int(state["skipped_steps"]), dtype=torch.float64, device=self.device)
        empty = int(state.get("empty_windows", 0))  # older checkpoints did not count them
        self._empty = torch.full((), empty, dtype=torch.float64, device=self.device)

    # ------------------------------------------------------------------ the phases of a step

    def _observe_scaled(self, step: int | None, grads: Gradients) -> Tensor:
        """Before unscaling: the underflow observer's finding, NaN when it did not look."""
        observer = self.observers.underflow
        finding = None if observer is None else observer.before_unscale(step, grads.tensors)
        return self._not_sampled if finding is None else finding

    def _unscale_and_check(self, grads: Gradients) -> _Check:
        """Unscale in place; this rank's worst kind over the scaler's flag, the overflow sources and the norms."""
        found = self.scaler.unscale_(local_tensors(grads.tensors))
        for source in self._overflow_sources:
            found = torch.maximum(found, source().to(found.device, torch.float32))
        norms = grad_norms(grads.tensors, self.device)
        param_kinds = nonfinite_kinds(norms.per_tensor)
        local_kind = torch.maximum(found, param_kinds.max()) if grads.tensors else found
        return _Check(norms, param_kinds, local_kind)

    def _check_alone(self, grads: Gradients, max_grad_norm: float | None) -> tuple[GradNorms, _Agreement, bool]:
        """One process: the verdict of :meth:`_unscale_and_check` then :meth:`_agree`, with no reduction and
        fewer device ops. The global norm is the norm of the per-tensor norms, so it is NaN when any
        gradient holds a NaN and infinite when any holds an infinity (or the squares overflow): its
        non-finiteness, with the overflow sources, is the step's overflow flag (the scaler's flag is
        implied by it: a gradient holding an infinity or NaN before unscaling still holds one after).
        The kinds are told later from the norms (:class:`trainer.numerics.step_outcome.StepOutcome`): the
        forensics' evidence is the per-parameter norms themselves. With :meth:`compile_step`, the norms,
        the flag and the clip are one compiled graph (then ``True`` comes back: the gradients are clipped)."""
        found = self.scaler.unscale_(local_tensors(grads.tensors))
        for source in self._overflow_sources:
            found = torch.maximum(found, source().to(found.device, torch.float32))
        check_fn = self._compiled_check if self._compiled_check is not None and compilable(grads.tensors) else None
        if check_fn is not None:
            checked = check_fn(list(grads.tensors), max_grad_norm)
            norms, flag = GradNorms(checked.per_tensor, checked.total), checked.flag
        else:
            norms = grad_norms(grads.tensors, self.device)
            flag = nonfinite_flag(norms.total)
        if self._overflow_sources:  # the scaler's flag needs no max: a gradient it flags makes the norm non-finite
            flag = torch.maximum(found, flag)
        forensics = self.observers.forensics
        evidence = None if forensics is None else forensics.evidence(norms.per_tensor, grads)
        return norms, _Agreement(flag, None, evidence), check_fn is not None

    def _agree(self, check: _Check, grads: Gradients) -> _Agreement:
        """One MAX reduction over the ranks (the forensics' evidence rides along); the global norm's flag joins in."""
        forensics = self.observers.forensics
        evidence = None if forensics is None else forensics.evidence(check.param_kinds, grads)
        verdict = agree_across_ranks(check.local_kind, evidence)
        found_inf = torch.maximum(verdict.kind.clamp(max=1.0), nonfinite_flag(check.norms.total))  # kinds are 0, 1, 2
        return _Agreement(found_inf, verdict.rank_kinds, verdict.evidence)

    @staticmethod
    def _clip(grads: Gradients, norms: GradNorms, max_grad_norm: float | None) -> None:
        """Clip the unscaled gradients to ``max_grad_norm`` by their global norm (a skipped step is never applied)."""
        if max_grad_norm is not None and grads.tensors:
            clip_grads_(grads.tensors, max_grad_norm, norms.total)

    def _apply(self, optimizer: torch.optim.Optimizer, skip: Tensor, applied: Tensor) -> None:
        """Step the optimizer, which skips itself on the device where ``skip`` is 1: Halfcast's own through
        their direct step (no ``torch.optim`` step wrapper), others by the AMP protocol."""
        if isinstance(optimizer, DeviceSkipOptimizer):
            with torch.no_grad():
                optimizer.apply_update(skip, applied)
            return
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            optimizer.grad_scale = None  # type: ignore[attr-defined]
            optimizer.found_inf = skip  # type: ignore[attr-defined]
            try:
                optimizer.step()
            finally:
                del optimizer.grad_scale, optimizer.found_inf  # type: ignore[attr-defined]
            return
        if not self._warned_host_skip:
            log.warning(
                "%s cannot skip a step on the device: one host read of the overflow flag per step",
                type(optimizer).__name__,
            )
            self._warned_host_skip = True
        if not bool(skip):
            optimizer.step()

    def _update(self, found_inf: Tensor, no_data: Tensor | None, applied: Tensor) -> None:
        """Count a skipped step; advance the loss scale (held for a window without data). ``applied`` is
        ``found_inf``'s logical not when the window held data (the scaler's clean flag: no op of its own)."""
        self._skipped = self._skipped + found_inf  # float64 + float32 flag: exact, one op
        if no_data is None:
            self.scaler.update(found_inf, clean=applied)
        else:
            self._empty = self._empty + no_data.to(self._empty.device, torch.float64)
            self.scaler.update(found_inf, hold=no_data)


def _autocast_to(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast(device_type=device.type, dtype=dtype)


class PlainPrecision(PrecisionPolicy):
    """fp32 (full precision) or bf16 (autocast): no loss scaling, no conversion.

    bf16 has fp32's exponent range, so its gradients need no scale; the no-op scaler only
    keeps the checkpoint layout of every precision.
    """

    def __init__(self, name: Precision, device: torch.device, observers: StepObservers = NO_OBSERVERS) -> None:
        if name not in ("fp32", "bf16"):
            raise ValueError(f"PlainPrecision computes in fp32 or bf16, not {name!r}")
        super().__init__(name, device, NoOpLossScaler(device), observers)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast to bf16; fp32 runs as it is."""
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return _autocast_to(self.device, self.compute_dtype)


class Fp16Precision(PrecisionPolicy):
    """fp16 autocast with the loss scaler it owns (static or dynamic): losses are scaled, gradients unscaled.

    Args:
        device: the training device.
        scaler: the job's loss scaler (:func:`build_scaler`).
        observers: typically the forensics and an underflow sampler.
    """

    def __init__(self, device: torch.device, scaler: LossScaler, observers: StepObservers = NO_OBSERVERS) -> None:
        super().__init__("fp16", device, scaler, observers)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast to fp16."""
        return _autocast_to(self.device, self.compute_dtype)


class Fp8Precision(PrecisionPolicy):
    """fp8 Linears in a bf16-autocast model: the policy owns the model's conversion.

    Args:
        device: the training device (CUDA in jobs: :func:`check_supported`; any device in tests,
            which emulate the fp8 Linears).
        recipe: torchao's scaling recipe, ``tensorwise`` or ``rowwise``.
        observers: typically the forensics.
    """

    def __init__(
        self, device: torch.device, recipe: Fp8Recipe = "tensorwise", observers: StepObservers = NO_OBSERVERS
    ) -> None:
        super().__init__("fp8", device, NoOpLossScaler(device), observers)
        self.recipe: Fp8Recipe = recipe
        self._report: list[Fp8LayerReport] = []

    @property
    def fp8_report(self) -> list[Fp8LayerReport]:
        """Every Linear of the prepared model and whether (and why not) it runs in fp8."""
        return self._report

    @property
    def fp8_layers(self) -> list[str]:
        """Names of the Linear layers converted to fp8."""
        return [row["module"] for row in self._report if row["fp8"]]

    def start_fields(self) -> PolicyStartFields:
        """``fp8_layers``: the per-Linear report, for the ``start`` record."""
        return {"fp8_layers": self._report}

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Swap the eligible Linears for fp8 ones (:func:`trainer.numerics.fp8.convert_to_fp8`).

        torchao on CUDA, the emulated Linear elsewhere (for tests: jobs are rejected off CUDA by
        :func:`check_supported`); an emulated fp8 overflow skips the step like a gradient overflow.
        """
        conversion = convert_to_fp8(model, self.recipe, emulate=self.device.type != "cuda")
        self._report = conversion.report
        if conversion.overflow is not None:
            self.add_overflow_source(conversion.overflow.consume)
        return model

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast to bf16 (the fp8 Linears cast their own GEMM operands)."""
        return _autocast_to(self.device, self.compute_dtype)


# ----------------------------------------------------------------------------- the factory


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


def _check_fp8(device: torch.device) -> None:
    if device.type != "cuda":
        raise PrecisionUnsupportedError(
            f"fp8 needs a CUDA GPU with compute capability >= 8.9; this rank runs on {device.type}"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise PrecisionUnsupportedError(
            f"fp8 needs compute capability >= 8.9; {name} has {capability[0]}.{capability[1]}"
        )
    try:
        import torchao.float8  # noqa: F401
    except ImportError as exc:
        raise PrecisionUnsupportedError("fp8 needs the torchao package on the worker") from exc


def _check_bf16(device: torch.device) -> None:
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise PrecisionUnsupportedError(f"bf16 is not supported on {torch.cuda.get_device_name(device)}")


_DEVICE_CHECKS: Mapping[str, Callable[[torch.device], None]] = {"fp8": _check_fp8, "bf16": _check_bf16}


def check_supported(precision: str, device: torch.device) -> None:
    """Raise :class:`PrecisionUnsupportedError` if ``precision`` cannot run on ``device``.

    Never falls back to another precision: fp8 needs CUDA with compute capability
    >= 8.9 and torchao; bf16 on CUDA needs hardware bf16 support.
    """
    device_check = _DEVICE_CHECKS.get(precision)
    if device_check is not None:
        device_check(device)


def _observers(spec: JobSpec, device: torch.device) -> StepObservers:
    """Forensics on every job; underflow sampling where the effective loss-scale block asks (fp16 only)."""
    scaling = spec.effective_loss_scale
    interval = scaling.underflow_sample_interval if scaling is not None else None
    return StepObservers(
        underflow=None if interval is None else UnderflowSampler(interval, device), forensics=OverflowForensics()
    )


def _plain(spec: JobSpec, device: torch.device) -> PrecisionPolicy:
    return PlainPrecision(spec.precision, device, _observers(spec, device))


def _fp16(spec: JobSpec, device: torch.device) -> PrecisionPolicy:
    return Fp16Precision(device, build_scaler(spec.effective_loss_scale, device), _observers(spec, device))


def _fp8(spec: JobSpec, device: torch.device) -> PrecisionPolicy:
    return Fp8Precision(device, spec.effective_fp8_recipe or "tensorwise", _observers(spec, device))


_POLICIES: Mapping[str, Callable[[JobSpec, torch.device], PrecisionPolicy]] = {
    "fp32": _plain,
    "bf16": _plain,
    "fp16": _fp16,
    "fp8": _fp8,
}


def build_precision(spec: JobSpec, device: torch.device) -> PrecisionPolicy:
    """The precision policy a job spec asks for, on ``device``.

    Raises:
        PrecisionUnsupportedError: the precision cannot run on ``device`` (see :func:`check_supported`).
    """
    check_supported(spec.precision, device)
    return _POLICIES[spec.precision](spec, device)
