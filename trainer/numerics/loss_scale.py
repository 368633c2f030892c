"""Loss scalers: dynamic, static and no-op. Pure tensor code, device-agnostic, no host syncs.

A loss scaler multiplies the loss before ``backward`` so that small fp16 gradients do
not flush to zero, then divides the gradients back ("unscale") and reports whether
any of them is non-finite ("overflow").

Dynamic loss scaling follows Micikevicius et al., "Mixed Precision Training"
(ICLR 2018, arXiv:1710.03740) with the growth/backoff rule of PyTorch's
``torch.amp.GradScaler`` and the hysteresis of Megatron-LM's
``DynamicGradScaler`` / DeepSpeed's ``DynamicLossScaler``:

* on an overflow the growth tracker resets and the hysteresis tracker drops by one;
  when it reaches zero the scale is multiplied by ``backoff_factor``;
* after ``growth_interval`` consecutive clean steps the scale is multiplied by
  ``growth_factor`` and the hysteresis tracker is refilled (with
  ``consecutive_hysteresis`` every clean step refills it, so only *consecutive*
  overflows back off);
* the scale is always clamped to ``[min_scale, max_scale]``, so it is never 0,
  subnormal or infinite. The scale is float32, so the bounds are first rounded
  *inward* to float32 (:mod:`halfcast.contracts.scale_bounds`): a bound float32 cannot hold is
  never crossed by rounding (``max_scale = 2**24 + 3`` holds the scale at ``2**24 + 2``);
* a step that measured nothing (``hold``: a window without loss-bearing elements)
  leaves the scale and both trackers as they are.

With ``hysteresis=1`` and no bound reached, the scale trajectory equals
``torch.amp.GradScaler``'s for the same overflow pattern, bit for bit, with any factors: like
GradScaler, ``scale * factor`` is rounded to float32 once (factors that are not powers of two,
e.g. 0.9, are applied in float64).

All state lives in 0-d tensors on the scaler's device and is updated with tensor
ops only, so ``update`` never synchronises the host with the device.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypedDict

import torch
from torch import Tensor

from halfcast.contracts.scale_bounds import FLOAT32_MAX, float32_bounds


class FixedScalerState(TypedDict):
    """A static or no-op scaler's checkpointed state: its class name and its scale."""

    kind: str
    scale: float


class DynamicScalerState(TypedDict):
    """:class:`DynamicLossScaler`'s checkpointed state: scale and trackers, then its configuration."""

    kind: str
    scale: float
    growth_tracker: int
    hysteresis_tracker: int
    growth_factor: float
    backoff_factor: float
    growth_interval: int
    hysteresis: int
    min_scale: float
    max_scale: float
    consecutive_hysteresis: bool


#: What a scaler's ``state_dict`` gives (the ``scaler`` part of a checkpoint's ``precision`` entry).
ScalerState = FixedScalerState | DynamicScalerState


class LossScaler(Protocol):
    """What the precision policy needs from a loss scaler."""

    @property
    def scale(self) -> Tensor:
        """Current loss scale: 0-d float32 tensor on the scaler's device."""
        ...

    def scale_loss(self, loss: Tensor) -> Tensor:
        """Return ``loss * scale`` in float32 (any shape; usually 0-d)."""
        ...

    def unscale_(self, grads: Iterable[Tensor]) -> Tensor:
        """Divide ``grads`` by the scale in place; return the overflow flag.

        Returns a 0-d float32 tensor, 1.0 if any gradient holds inf or NaN, else 0.0.
        """
        ...

    def update(self, found_inf: Tensor, hold: Tensor | None = None, clean: Tensor | None = None) -> None:
        """Advance the scale after a step whose overflow flag is ``found_inf`` (0-d).

        ``hold`` (0-d bool, optional): when true the step measured nothing (no
        loss-bearing element in its window) and the state is left as it is. ``clean``
        (0-d bool, optional): ``found_inf.logical_not()`` when the caller already has it
        (a scaler that needs it then spends no op on it).
        """
        ...

    def state_dict(self) -> ScalerState: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def unscale_and_check_(grads: Iterable[Tensor], inv_scale: Tensor, found_inf: Tensor) -> None:
    """Multiply ``grads`` by ``inv_scale`` in place and set ``found_inf`` to 1 on inf/NaN.

    Uses PyTorch's fused ``_amp_foreach_non_finite_check_and_unscale_`` kernel (the
    one ``GradScaler`` uses), one launch per (device, dtype) group.

    Raises:
        ValueError: for sparse gradients (not supported).
    """
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = defaultdict(list)
    for grad in grads:
        if grad.is_sparse:
            raise ValueError("sparse gradients are not supported by the loss scaler")
        groups[(grad.device, grad.dtype)].append(grad)
    for (device, _dtype), group in groups.items():
        flag = found_inf if found_inf.device == device else torch.zeros_like(found_inf, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(group, flag, inv_scale.to(device))
        if flag is not found_inf:
            found_inf.copy_(torch.maximum(found_inf, flag.to(found_inf.device)))


class _FixedScaler:
    """A scaler whose scale never changes (base of the static and no-op scalers)."""

    def __init__(self, scale: float, device: torch.device | str = "cpu") -> None:
        if not (scale > 0.0 and scale < float("inf")):
            raise ValueError(f"loss scale must be finite and > 0, got {scale}")
        self._scale = torch.tensor(float(scale), dtype=torch.float32, device=device)
        self._inv_scale = torch.reciprocal(self._scale)

    @property
    def scale(self) -> Tensor:
        return self._scale

    def scale_loss(self, loss: Tensor) -> Tensor:
        return loss.float() * self._scale

    def unscale_(self, grads: Iterable[Tensor]) -> Tensor:
        found_inf = torch.zeros((), dtype=torch.float32, device=self._scale.device)
        unscale_and_check_(grads, self._inv_scale, found_inf)
        return found_inf

    def update(self, found_inf: Tensor, hold: Tensor | None = None, clean: Tensor | None = None) -> None:
        """A fixed scale does not change."""

    def state_dict(self) -> FixedScalerState:
        return {"kind": type(self).__name__, "scale": self._scale.item()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("kind") != type(self).__name__ or state.get("scale") != self._scale.item():
            raise ValueError(f"checkpointed scaler {dict(state)} does not match {self.state_dict()}")


class StaticLossScaler(_FixedScaler):
    """Static loss scaling: every step uses ``scale``; overflowing steps are still reported."""


class NoOpLossScaler(_FixedScaler):
    """Scale 1.0 for fp32 and bf16: ``scale_loss`` is the identity and ``unscale_`` touches nothing.

    ``unscale_`` returns a clean flag without reading the gradients: the precision step
    takes every gradient's norm anyway (for the global norm and clipping), and an inf or
    NaN element makes its tensor's norm inf or NaN, which skips the step
    (:meth:`trainer.numerics.precision.PrecisionPolicy.step`). So a NaN gradient is still never
    applied in any precision, and fp32/bf16 steps save a read and a write of every
    gradient (the unscale-by-1.0 pass).
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        super().__init__(1.0, device)
        self._clean = torch.zeros((), dtype=torch.float32, device=device)

    def scale_loss(self, loss: Tensor) -> Tensor:
        return loss

    def unscale_(self, grads: Iterable[Tensor]) -> Tensor:
        """A clean flag (0-d float32 0.0); the gradients are neither read nor written (see the class).

        The same tensor on every call (no device op): callers combine flags out of place, never write one.
        """
        return self._clean


class DynamicLossScaler:
    """Dynamic loss scaling with growth, backoff, hysteresis and ``[min_scale, max_scale]`` bounds.

    Args:
        init_scale: first scale; must lie in ``[min_scale, max_scale]`` (then clamped to
            the float32 bounds, so a bound float32 cannot hold is never crossed).
        growth_factor: multiplier after ``growth_interval`` clean steps (> 1).
        backoff_factor: multiplier on a counted overflow (in (0, 1)).
        growth_interval: clean steps between growths (>= 1).
        hysteresis: overflows tolerated before a backoff (>= 1; 1 = back off on every overflow).
        min_scale, max_scale: clamp bounds (finite, > 0); kept rounded inward to float32 in
            :attr:`min_scale` and :attr:`max_scale` (what the scale can actually reach).
        consecutive_hysteresis: refill the hysteresis tracker on every clean step.
        device: where the state tensors live (the gradients' device).

    Raises:
        ValueError: for any argument out of range, or bounds that bracket no float32.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        hysteresis: int = 1,
        min_scale: float = 1.0,
        max_scale: float = 2.0**24,
        consecutive_hysteresis: bool = False,
        device: torch.device | str = "cpu",
    ) -> None:
        _check_dynamic_args(
            init_scale, growth_factor, backoff_factor, growth_interval, hysteresis, min_scale, max_scale
        )
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.hysteresis = int(hysteresis)
        self.min_scale, self.max_scale = float32_bounds(float(min_scale), float(max_scale))
        self.consecutive_hysteresis = bool(consecutive_hysteresis)
        init = torch.tensor(float(init_scale), dtype=torch.float32, device=device)
        self._scale = init.clamp(self.min_scale, self.max_scale)
        self._growth_tracker = torch.zeros((), dtype=torch.int32, device=device)
        self._hysteresis_tracker = torch.full((), self.hysteresis, dtype=torch.int32, device=device)
        # Factors float32 cannot apply exactly are applied in float64 (see _times_factor).
        # PyTorch's fused update kernel applies the rule exactly when there is no hysteresis and growth from
        # any reachable scale stays finite in float32 (the kernel would keep the scale where the rule clamps).
        self._fused_update = self.hysteresis == 1 and self.max_scale * self.growth_factor < FLOAT32_MAX
        exact = _is_power_of_two(self.growth_factor) and _is_power_of_two(self.backoff_factor)
        self._factors64 = (
            None
            if exact
            else torch.tensor([self.backoff_factor, self.growth_factor, 1.0], dtype=torch.float64, device=device)
        )

    @property
    def scale(self) -> Tensor:
        return self._scale

    @property
    def growth_tracker(self) -> Tensor:
        """Consecutive clean steps since the last growth or overflow (0-d int32)."""
        return self._growth_tracker

    @property
    def hysteresis_tracker(self) -> Tensor:
        """Overflows still tolerated before the next backoff (0-d int32)."""
        return self._hysteresis_tracker

    def scale_loss(self, loss: Tensor) -> Tensor:
        return loss.float() * self._scale

    def unscale_(self, grads: Iterable[Tensor]) -> Tensor:
        found_inf = torch.zeros((), dtype=torch.float32, device=self._scale.device)
        unscale_and_check_(grads, torch.reciprocal(self._scale), found_inf)
        return found_inf

    def update(self, found_inf: Tensor, hold: Tensor | None = None, clean: Tensor | None = None) -> None:
        """Apply the growth/backoff/hysteresis rule for one step, on the device (no host sync).

        With ``hold`` (0-d bool) true the step measured nothing (a window without
        loss-bearing elements): scale and trackers keep their values. The state tensors
        are replaced, not written in place, so a tensor taken from :attr:`scale` before
        the update still holds the scale that step used.
        """
        if hold is None and self._fused_update:
            self._update_fused(found_inf.to(self._scale.device, torch.float32), clean)
            return
        found = found_inf.to(self._scale.device) > 0
        hysteresis = torch.where(found, (self._hysteresis_tracker - 1).clamp_min(0), self._hysteresis_tracker)
        back_off = found & (hysteresis <= 0)
        growth = torch.where(found, 0, self._growth_tracker + 1)
        grow = growth >= self.growth_interval  # never on an overflow: growth is 0 and growth_interval >= 1
        refill = (grow | ~found) if self.consecutive_hysteresis else grow
        scale = self._times_factor(back_off, grow).clamp(self.min_scale, self.max_scale)
        growth_tracker = torch.where(grow, 0, growth)
        hysteresis_tracker = torch.where(refill, self.hysteresis, hysteresis)
        if hold is not None:
            keep = hold.to(device=self._scale.device, dtype=torch.bool)
            scale = torch.where(keep, self._scale, scale)
            growth_tracker = torch.where(keep, self._growth_tracker, growth_tracker)
            hysteresis_tracker = torch.where(keep, self._hysteresis_tracker, hysteresis_tracker)
        self._scale, self._growth_tracker, self._hysteresis_tracker = scale, growth_tracker, hysteresis_tracker

    def _update_fused(self, found_inf: Tensor, clean: Tensor | None = None) -> None:
        """The same rule with hysteresis 1, in six device ops: PyTorch's ``_amp_update_scale_`` kernel (the one
        ``GradScaler.update`` runs: growth tracker, backoff, growth by a factor applied in float64 and rounded
        once) on a copy of the scale, then the clamp to the bounds and the hysteresis tracker (0 after an
        overflow, refilled to 1 by a growth, or by every clean step with ``consecutive_hysteresis``).

        Equal to the general rule: with hysteresis 1 every overflow backs off; the kernel keeps the scale
        when ``scale * growth_factor`` is not finite, which :attr:`_fused_update` rules out for every
        scale up to ``max_scale``; the kernel grows at ``tracker + 1 == growth_interval``, and the tracker
        stays below the interval (:meth:`load_state_dict` caps a checkpointed one at ``interval - 1``,
        which grows on the next clean step, as the general rule would).
        """
        scale = self._scale.clone()  # a tensor taken from ``scale`` before the update keeps that step's scale
        torch._amp_update_scale_(
            scale, self._growth_tracker, found_inf, self.growth_factor, self.backoff_factor, self.growth_interval
        )
        scale.clamp_(self.min_scale, self.max_scale)
        if clean is None or clean.device != scale.device:
            clean = found_inf.logical_not()  # found_inf == 0 (a tensor op without a scalar operand: less host work)
        if self.consecutive_hysteresis:
            self._hysteresis_tracker = clean.int()
        else:  # a growth or an overflow both left the growth tracker at 0
            reset = self._growth_tracker.logical_not()
            self._hysteresis_tracker = torch.where(reset, clean, self._hysteresis_tracker)
        self._scale = scale

    def _times_factor(self, back_off: Tensor, grow: Tensor) -> Tensor:
        """The scale times this step's factor (``backoff_factor``, ``growth_factor`` or 1), rounded once
        to float32, as ``torch.amp.GradScaler`` does (it multiplies the float32 scale by the factor
        held as a double). Power-of-two factors (the defaults) are exact in float32; others, such as
        0.9 or 1.1, are multiplied in float64: rounding the factor to float32 first would drift the
        scale by an ulp from GradScaler's at every change."""
        if self._factors64 is None:
            return self._scale * torch.where(back_off, self.backoff_factor, torch.where(grow, self.growth_factor, 1.0))
        backoff, growth, one = self._factors64.unbind()
        factor = torch.where(back_off, backoff, torch.where(grow, growth, one))
        return (self._scale.double() * factor).float()

    def state_dict(self) -> DynamicScalerState:
        """Exact state: scale, trackers and configuration (python scalars; syncs the host)."""
        return {
            "kind": "DynamicLossScaler",
            "scale": self._scale.item(),
            "growth_tracker": int(self._growth_tracker.item()),
            "hysteresis_tracker": int(self._hysteresis_tracker.item()),
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "hysteresis": self.hysteresis,
            "min_scale": self.min_scale,
            "max_scale": self.max_scale,
            "consecutive_hysteresis": self.consecutive_hysteresis,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore scale and trackers exactly; the configuration comes from the (new) spec.

        Raises:
            ValueError: if ``state`` is not a dynamic scaler's or holds an unusable scale.
        """
        if state.get("kind") != "DynamicLossScaler":
            raise ValueError(f"not a DynamicLossScaler state: kind={state.get('kind')!r}")
        scale = float(state["scale"])
        if not (scale > 0.0 and scale < float("inf")):
            raise ValueError(f"checkpointed loss scale {scale} is not finite and > 0")
        self._scale.fill_(min(max(scale, self.min_scale), self.max_scale))
        self._growth_tracker.fill_(min(int(state["growth_tracker"]), self.growth_interval - 1))
        self._hysteresis_tracker.fill_(int(state["hysteresis_tracker"]))


def _is_power_of_two(value: float) -> bool:
    """Whether ``value`` is ``2**k`` for an integer ``k`` (multiplying a float32 by it is exact, bar range)."""
    return value > 0.0 and math.frexp(value)[0] == 0.5


def _check_dynamic_args(
    init_scale: float,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    hysteresis: int,
    min_scale: float,
    max_scale: float,
) -> None:
    inf = float("inf")
    checks = {
        "min_scale": 0.0 < min_scale < inf,
        "max_scale": min_scale <= max_scale <= FLOAT32_MAX,
        "init_scale": min_scale <= init_scale <= max_scale,
        "growth_factor": 1.0 < growth_factor < inf,
        "backoff_factor": 0.0 < backoff_factor < 1.0,
        "growth_interval": growth_interval >= 1,
        "hysteresis": hysteresis >= 1,
    }
    bad = [name for name, ok in checks.items() if not ok]
    if not bad:
        try:
            float32_bounds(min_scale, max_scale)
        except ValueError:
            bad = ["min_scale", "max_scale"]
    if bad:
        raise ValueError(
            f"invalid loss-scaler arguments {bad}: init_scale={init_scale}, growth_factor={growth_factor}, "
            f"backoff_factor={backoff_factor}, growth_interval={growth_interval}, hysteresis={hysteresis}, "
            f"min_scale={min_scale}, max_scale={max_scale}"
        )
