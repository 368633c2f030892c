"""AdamW and SGD whose step is skipped on the device: no host synchronisation, on every path.

:class:`AdamW` and :class:`SGD` subclass ``torch.optim.AdamW`` / ``torch.optim.SGD``
(same ``param_groups``, state keys and ``state_dict`` format) and follow PyTorch's
AMP protocol (``_step_supports_amp_scaling``): before ``step()`` the caller sets
``optimizer.found_inf`` (0-d float32 on the parameters' device, 1.0 = overflow) and
``optimizer.grad_scale = None`` (gradients already unscaled). When ``found_inf`` is 1
the step changes nothing: parameters, moments, momentum buffers and step counters keep
their bits. The decision is made by tensor arithmetic, never read on the host.

Three implementations, chosen per optimizer:

* ``fused``: PyTorch's fused kernels (``torch._fused_adamw_`` / ``torch._fused_sgd_``),
  which take ``found_inf`` and skip on the device (fused Adam undoes its step increment).
* ``foreach`` and ``plain``: Halfcast's masked update (below), with ``torch._foreach_*``
  ops or one op per tensor. PyTorch's own non-fused paths cannot skip on the device
  (their bias correction reads the step count on the host, and foreach AdamW rejects a
  tensor learning rate).

The masked update. ``skip = found_inf != 0``. Every scalar that multiplies or adds into
state is selected on the device: ``where(skip, identity, value)`` (1 for factors, 0 for
increments), and the gradients are replaced by ``where(skip, -0.0, grad)``, so a skipped
step never lets inf or NaN touch the state and adds only zeros (``x + (-0.0) == x`` for
every ``x``; ``x * 1 == x``). On applied steps the arithmetic is exactly PyTorch's
non-capturable ``_single_tensor_*`` / ``_multi_tensor_*`` code with the same rounding
(scalars computed in float64 like Python floats, cast to float32 where the kernels cast
them), so results are bit-identical to ``torch.optim.AdamW`` / ``SGD`` on CPU (tested).
One documented exception: a parameter or first moment equal to ``-0.0`` may become
``+0.0`` on a skipped step (the masked increment is ``±0``); IEEE addition never
produces ``-0.0`` from a nonzero operand, so this needs a parameter initialised to -0.0.

State is created eagerly at construction, identical on every path: AdamW ``step`` 0.0
(float32, on the parameter's device), ``exp_avg`` and ``exp_avg_sq`` zeros; SGD with
momentum a ``momentum_buffer`` of ``-0.0`` (so the first applied step gives
``buffer = grad`` exactly, PyTorch's ``clone``). Eager state means a skipped *first*
step needs no special case (PyTorch's fused SGD would otherwise keep an uninitialised
``torch.empty`` momentum buffer after a skipped first step). The learning rate of each
group is a 0-d tensor on the device (float64 on CPU, float32 elsewhere, as fused CUDA
kernels read it), written by :class:`trainer.optim.schedule.DeviceLRSchedule`; the base rate
stays in ``group["initial_lr"]``.

Algorithms: AdamW, Loshchilov & Hutter, "Decoupled Weight Decay Regularization"
(ICLR 2019, arXiv:1711.05101), in PyTorch's formulation; SGD with momentum as
``torch.optim.SGD`` (dampening 0, no Nesterov). Every parameter must have a gradient
at every step (else ``ValueError``): all step counters of a group then stay equal, and
the bias correction is computed once per group. FSDP2 ``DTensor`` parameters are
updated through their local shards (same storage).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from torch import Tensor

from trainer.parallel.sharded import local_tensors

Implementation = Literal["plain", "foreach", "fused"]

#: Device types whose fused AdamW / SGD kernels take ``found_inf`` (PyTorch >= 2.4).
FUSED_DEVICE_TYPES = frozenset({"cpu", "cuda"})


def lr_dtype(device: torch.device) -> torch.dtype:
    """dtype of the 0-d learning-rate tensor: float64 on CPU (Python-float exact), float32 elsewhere."""
    return torch.float64 if device.type == "cpu" else torch.float32


def fused_supported(parameters: Iterable[Tensor]) -> bool:
    """True when every parameter is a floating-point tensor on a device with fused kernels."""
    params = list(parameters)
    return bool(params) and all(p.is_floating_point() and p.device.type in FUSED_DEVICE_TYPES for p in params)


_FLAGS: dict[str, dict[str, bool]] = {
    "plain": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def _flags(implementation: Implementation) -> dict[str, bool]:
    """PyTorch's constructor flags for ``implementation`` (``ValueError`` for an unknown one)."""
    if implementation not in _FLAGS:
        raise ValueError(f"unknown optimizer implementation {implementation!r}")
    return _FLAGS[implementation]


def _unhooked(step: Callable[..., Any]) -> Callable[..., Any]:
    """A PyTorch optimizer's ``step`` without the profiling/hook wrapper PyTorch adds to the class of the
    first instance made (``Optimizer.profile_hook_step``): this class's own ``step`` is wrapped already,
    so calling the parent's wrapped one would run the step hooks and the profiler range twice (it is
    wrapped as soon as any plain ``torch.optim`` instance of that class exists in the process)."""
    return step.__wrapped__ if getattr(step, "hooked", False) else step  # type: ignore[attr-defined]


class DeviceSkipOptimizer:
    """The base of Halfcast's optimizers (a mixin before the ``torch.optim`` class): eager state, tensor
    learning rates, the AMP attributes, state loading, and the direct step the precision step calls
    (:meth:`apply_update`)."""

    _step_supports_amp_scaling = True
    param_groups: list[dict[str, Any]]  # open mapping: torch.optim's param groups (its own type)
    state: Any

    def _device_setup(self) -> None:
        for group in self.param_groups:
            device = group["params"][0].device
            base = float(group["lr"])
            group.setdefault("initial_lr", base)
            group["lr"] = torch.full((), base, dtype=lr_dtype(device), device=device)
            for param in group["params"]:
                self._init_state(group, param)

    def _init_state(self, group: dict[str, Any], param: Tensor) -> None:  # open mapping: a param group
        raise NotImplementedError

    def apply_update(self, found_inf: Tensor, applied: Tensor | None = None) -> None:
        """The step itself, skipped on the device where ``found_inf`` (0-d float32, on the parameters'
        device) is 1, called by the precision step under ``torch.no_grad()``: no closure, and not
        through ``torch.optim``'s step wrapper (its step hooks, which Halfcast never registers, and its
        profiler range: two host ops and Python per step). ``applied`` (0-d bool, optional): not
        ``found_inf``, when the caller has it (fused AdamW then counts its steps with it)."""
        raise NotImplementedError

    def clear_grads(self) -> None:
        """``zero_grad(set_to_none=True)`` without its wrapper (profiler range, hooks): every gradient to ``None``."""
        for group in self.param_groups:
            for param in group["params"]:
                param.grad = None

    def _flag(self, device: torch.device) -> Tensor | None:
        """``found_inf`` for this step (checked), or ``None`` for an unconditional step."""
        if getattr(self, "grad_scale", None) is not None:
            raise ValueError("Halfcast optimizers take unscaled gradients: set grad_scale to None")
        found_inf: Tensor | None = getattr(self, "found_inf", None)
        if found_inf is not None and (found_inf.dim() != 0 or found_inf.device.type != device.type):
            raise ValueError(
                f"found_inf must be a 0-d tensor on {device}, got shape {tuple(found_inf.shape)} on {found_inf.device}"
            )
        return found_inf

    def _after_load(self) -> None:
        """Move step counters and learning rates back onto the parameters' device.

        Raises:
            ValueError: if the step counters of one group differ (they never do when
                written by these optimizers).
        """
        for group in self.param_groups:
            device = group["params"][0].device
            group["lr"] = torch.as_tensor(group["lr"]).to(device=device, dtype=lr_dtype(device)).clone()
            steps = []
            for param in group["params"]:
                state = self.state[param]
                if not state:
                    self._init_state(group, param)
                if "step" in state:
                    state["step"] = state["step"].to(device=param.device, dtype=torch.float32)
                    steps.append(float(state["step"]))
            if len(set(steps)) > 1:
                raise ValueError(f"optimizer state has unequal step counts in one group: {sorted(set(steps))}")


def _evaluate_closure(closure: Callable[[], float] | None) -> float | None:
    """The optimizer-closure convention: re-evaluate the loss with gradients enabled."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _grads(params: Sequence[Tensor]) -> list[Tensor]:
    missing = sum(p.grad is None for p in params)
    if missing:
        raise ValueError(f"{missing} of {len(params)} parameters have no gradient; every parameter must have one")
    return [p.grad for p in params]  # type: ignore[misc]


def _masked_grads(grads: Sequence[Tensor], skip: Tensor) -> list[Tensor]:
    """``where(skip, -0.0, g)`` for every gradient: finite on applied steps, additive identity on skipped ones."""
    return [torch.where(skip, -0.0, g) for g in grads]


# ----------------------------------------------------------------------------- AdamW


@dataclass(frozen=True)
class _AdamScalars:
    """Masked 0-d float32 scalars of one AdamW step (identity values when skipped)."""

    keep: Tensor  # 1.0 applied, 0.0 skipped: the step-counter increment
    decay: Tensor  # 1 - lr * weight_decay
    beta1_weight: Tensor  # 1 - beta1 (lerp weight)
    beta2: Tensor
    one_minus_beta2: Tensor
    step_size: Tensor  # -lr / (1 - beta1 ** t)
    bias_correction2_sqrt: Tensor  # sqrt(1 - beta2 ** t)


# open mapping: ``group`` is a torch.optim param group
def _adam_scalars(found_inf: Tensor | None, step: Tensor, group: dict[str, Any]) -> tuple[Tensor, _AdamScalars]:
    """``skip`` and the masked scalars; ``step`` is the group's step count *before* this step."""
    device = step.device
    beta1, beta2 = group["betas"]
    skip = torch.zeros((), dtype=torch.bool, device=device) if found_inf is None else found_inf.ne(0)
    keep = (~skip).float()
    lr = group["lr"].double()
    t = step.double() + keep.double()
    bias_correction1 = 1 - torch.pow(beta1, t)
    bias_correction2 = 1 - torch.pow(beta2, t)
    scalars = _AdamScalars(
        keep=keep,
        decay=torch.where(skip, 1.0, 1 - lr * group["weight_decay"]).float(),
        beta1_weight=torch.where(skip, 0.0, 1 - beta1),
        beta2=torch.where(skip, 1.0, beta2),
        one_minus_beta2=torch.where(skip, 0.0, 1 - beta2),
        step_size=torch.where(skip, 0.0, (lr / bias_correction1) * -1).float(),
        bias_correction2_sqrt=torch.where(skip, 1.0, bias_correction2**0.5).float(),
    )
    return skip, scalars


def _adamw_foreach(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    steps: list[Tensor],
    s: _AdamScalars,
    weight_decay: float,
    eps: float,
) -> None:
    torch._foreach_add_(steps, s.keep, alpha=1)  # alpha selects the Tensor overload (else: a host read)
    if weight_decay != 0:
        torch._foreach_mul_(params, s.decay)
    torch._foreach_lerp_(exp_avgs, grads, [s.beta1_weight] * len(grads))
    torch._foreach_mul_(exp_avg_sqs, s.beta2)
    torch._foreach_addcmul_(exp_avg_sqs, torch._foreach_mul(grads, s.one_minus_beta2), grads)
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, s.bias_correction2_sqrt)
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(params, torch._foreach_mul(exp_avgs, s.step_size), denom)


def _adamw_plain(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    steps: list[Tensor],
    s: _AdamScalars,
    weight_decay: float,
    eps: float,
) -> None:
    for param, grad, exp_avg, exp_avg_sq, step in zip(params, grads, exp_avgs, exp_avg_sqs, steps, strict=True):
        step.add_(s.keep)
        if weight_decay != 0:
            param.mul_(s.decay)
        exp_avg.lerp_(grad, s.beta1_weight)
        exp_avg_sq.mul_(s.beta2).addcmul_(grad.mul(s.one_minus_beta2), grad)
        denom = (exp_avg_sq.sqrt() / s.bias_correction2_sqrt).add_(eps)
        param.addcdiv_(exp_avg.mul(s.step_size), denom)


def _adamw_fused(
    params: list[Tensor],
    grads: list[Tensor],
    state: Sequence[dict[str, Tensor]],
    found_inf: Tensor | None,
    # open mapping: a torch.optim param group
    group: dict[str, Any],
    applied: Tensor | None = None,
) -> None:
    """``params`` and ``grads`` are local tensors (FSDP2 shards), like the moments taken from ``state``.

    PyTorch's fused AdamW step exactly as ``torch.optim.AdamW(fused=True)`` runs it on these groups
    (step counters + 1, the kernel per (device, dtype), which skips itself where ``found_inf`` is 1, then
    the counters - ``found_inf``), without the Python layers around it (its step wrapper, argument
    checks and dispatch: a fixed host cost per step). Given ``applied`` (not ``found_inf``), the
    counters are advanced by it instead, in one op: the same counts (the kernel reads them only on
    applied steps, and skips on the others). No amsgrad, no maximize: this class sets neither."""
    beta1, beta2 = group["betas"]
    moments = [local_tensors(st["exp_avg"] for st in state), local_tensors(st["exp_avg_sq"] for st in state)]
    tensors = [params, grads, *moments]
    steps = [st["step"] for st in state]
    grouped = torch.optim.Optimizer._group_tensors_by_device_and_dtype([*tensors, steps])  # type: ignore[list-item]
    for lists, _ in grouped.values():
        p, g, m, v, t = cast(list[list[Tensor]], lists)
        if found_inf is not None and applied is not None:
            torch._foreach_add_(t, applied, alpha=1)  # alpha selects the Tensor overload (else: a host read)
        else:
            torch._foreach_add_(t, 1)
        torch._fused_adamw_(
            p,
            g,
            m,
            v,
            [],
            t,
            amsgrad=False,
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
            grad_scale=None,
            found_inf=found_inf,
        )
        if found_inf is not None and applied is None:
            torch._foreach_sub_(t, [found_inf] * len(t))


class AdamW(DeviceSkipOptimizer, torch.optim.AdamW):
    """``torch.optim.AdamW`` with a device-side skip on every implementation (see the module docstring).

    Args:
        params: the parameters (all on one device per group).
        lr, betas, eps, weight_decay: as ``torch.optim.AdamW`` (lr a Python float: the base rate).
        implementation: ``plain``, ``foreach`` or ``fused``.

    Raises:
        ValueError: for an unknown implementation or PyTorch's own argument errors.
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        implementation: Implementation = "foreach",
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **_flags(implementation))
        self._device_setup()

    def _init_state(self, group: dict[str, Any], param: Tensor) -> None:  # open mapping: a param group
        state = self.state[param]
        state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One AdamW step, skipped on the device when ``self.found_inf`` is 1.

        Raises:
            ValueError: a parameter without gradient, a ``grad_scale``, or a malformed ``found_inf``.
        """
        loss = _evaluate_closure(closure)
        self._update(self._flag(self.param_groups[0]["params"][0].device), None)
        return loss

    def apply_update(self, found_inf: Tensor, applied: Tensor | None = None) -> None:
        self._update(found_inf, applied)

    def _update(self, found_inf: Tensor | None, applied: Tensor | None) -> None:
        for group in self.param_groups:
            params = group["params"]
            grads = _grads(params)
            state = [self.state[p] for p in params]
            if group["fused"]:
                _adamw_fused(local_tensors(params), local_tensors(grads), state, found_inf, group, applied)
                continue
            skip, scalars = _adam_scalars(found_inf, state[0]["step"], group)
            update = _adamw_foreach if group["foreach"] else _adamw_plain
            update(
                local_tensors(params),
                _masked_grads(local_tensors(grads), skip),
                local_tensors(st["exp_avg"] for st in state),
                local_tensors(st["exp_avg_sq"] for st in state),
                [st["step"] for st in state],
                scalars,
                group["weight_decay"],
                group["eps"],
            )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # open mapping: torch's optimizer state_dict
        """``torch.optim.AdamW.load_state_dict``, then step counters and lr tensors back on the device."""
        super().load_state_dict(state_dict)
        self._after_load()


# ----------------------------------------------------------------------------- SGD


def _sgd_update(
    params: list[Tensor],
    grads: list[Tensor] | tuple[Tensor, ...],
    buffers: list[Tensor] | None,
    skip: Tensor,
    # open mapping: a torch.optim param group
    group: dict[str, Any],
    foreach: bool,
) -> None:
    """``buffer = momentum * buffer + g``; ``param += -lr * buffer`` (or ``* g`` without momentum)."""
    weight_decay, momentum = group["weight_decay"], group["momentum"]
    neg_lr = torch.where(skip, 0.0, -group["lr"].double()).float()
    if foreach:
        if weight_decay != 0:
            grads = torch._foreach_add(grads, params, alpha=weight_decay)
        grads = _masked_grads(grads, skip)
        if buffers is not None:
            torch._foreach_mul_(buffers, torch.where(skip, 1.0, momentum))
            torch._foreach_add_(buffers, grads)
            grads = buffers
        torch._foreach_addcmul_(params, grads, [neg_lr] * len(params))
        return
    factor = torch.where(skip, 1.0, momentum) if buffers is not None else None
    for index, (param, grad) in enumerate(zip(params, grads, strict=True)):
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        grad = torch.where(skip, -0.0, grad)
        if buffers is not None and factor is not None:
            grad = buffers[index].mul_(factor).add_(grad)
        param.addcmul_(grad, neg_lr)


class SGD(DeviceSkipOptimizer, torch.optim.SGD):
    """``torch.optim.SGD`` (momentum, weight decay) with a device-side skip on every implementation.

    Args:
        params: the parameters (all on one device per group).
        lr, momentum, weight_decay: as ``torch.optim.SGD`` (dampening 0, no Nesterov).
        implementation: ``plain``, ``foreach`` or ``fused``.

    Raises:
        ValueError: for an unknown implementation or PyTorch's own argument errors.
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        *,
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        implementation: Implementation = "foreach",
    ) -> None:
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay, **_flags(implementation))
        self._device_setup()

    def _init_state(self, group: dict[str, Any], param: Tensor) -> None:  # open mapping: a param group
        if group["momentum"] != 0:
            buffer = torch.zeros_like(param, memory_format=torch.preserve_format)
            self.state[param]["momentum_buffer"] = buffer.fill_(-0.0)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One SGD step, skipped on the device when ``self.found_inf`` is 1.

        Raises:
            ValueError: a parameter without gradient, a ``grad_scale``, or a malformed ``found_inf``.
        """
        loss = _evaluate_closure(closure)
        self._update(self._flag(self.param_groups[0]["params"][0].device))
        return loss

    def apply_update(self, found_inf: Tensor, applied: Tensor | None = None) -> None:
        if not self.defaults["fused"]:
            self._update(found_inf)
            return
        self.grad_scale, self.found_inf = None, found_inf  # what PyTorch's fused step reads
        try:
            self._update(found_inf)
        finally:
            del self.grad_scale, self.found_inf

    def _update(self, found_inf: Tensor | None) -> None:
        for group in self.param_groups:
            params = list(group["params"])
            grads = _grads(params)
            if group["fused"]:
                continue
            skip = torch.zeros((), dtype=torch.bool, device=params[0].device) if found_inf is None else found_inf.ne(0)
            buffers = (
                local_tensors(self.state[p]["momentum_buffer"] for p in params) if group["momentum"] != 0 else None
            )
            _sgd_update(
                local_tensors(params), local_tensors(grads), buffers, skip, group, foreach=bool(group["foreach"])
            )
        if self.defaults["fused"]:
            _unhooked(torch.optim.SGD.step)(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # open mapping: torch's optimizer state_dict
        """``torch.optim.SGD.load_state_dict``, then lr tensors back on the device."""
        super().load_state_dict(state_dict)
        self._after_load()
