"""Learning-rate schedules over *applied* optimizer steps, computed on the device.

``lr(n) = initial_lr * m(n)`` where ``n`` is the number of applied (not skipped)
optimizer steps so far: a skipped step never advances the schedule (docs/trainer.md,
"Numerics of one optimizer step"; pytorch/pytorch#44511). The count ``n`` is a 0-d
int64 tensor on the device, advanced by the step's ``applied`` flag, and the next
step's learning rate is computed from it with tensor ops and written into each
``param_group["lr"]`` (a 0-d tensor, see :mod:`trainer.optim.skipping`): the host never
reads either.

The multiplier ``m`` (:class:`LRMultiplier` is the host closed form, the reference):

* warm-up, for ``n < W`` (``W = warmup_steps``): ``(n + 1) / W`` (linear, Goyal et al.,
  "Accurate, Large Minibatch SGD", arXiv:1706.02677);
* then with ``d = n - W`` and ``p = min(1, d / max(1, T - W))`` (``T`` = the job's
  ``max_steps``, ``r`` = ``min_lr_ratio``):
  ``constant`` 1; ``cosine`` ``r + (1 - r) * (1 + cos(pi * p)) / 2`` (Loshchilov &
  Hutter, "SGDR", ICLR 2017, one cycle without restarts); ``linear`` ``1 - (1 - r) * p``;
  ``step`` ``gamma ** floor(d / step_size)`` (``torch.optim.lr_scheduler.StepLR``).

The device computes in float64 with the same operation order as the Python formula, so
the learning rates equal :class:`LRMultiplier`'s exactly, except ``cosine``, where the
device's ``cos`` may differ from the C library's by one unit in the last place.
Per step the host issues few device ops (:class:`DeviceLRSchedule`): none for a constant
schedule, one lookup per param group in a table computed once for the others.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypedDict

import torch
from torch import Tensor

from halfcast.contracts.spec import LRSchedulerSpec
from trainer.optim.skipping import lr_dtype


class Decay(ABC):
    """The multiplier after warm-up, ``done = applied - warmup_steps`` steps into it: one class per schedule.

    ``host`` is the closed form on Python numbers (the reference), given ``done``; ``device`` the same on the
    0-d int64 ``applied`` count tensor (each form subtracts the warm-up where its arithmetic needs it), in
    float64 with the same operation order. ``flat``: the factor is always 1; ``holds_last_value``:
    the factor stops changing once ``done`` reaches the decay length (so a table of the run's steps covers it).
    """

    flat: ClassVar[bool] = False
    holds_last_value: ClassVar[bool] = True

    @abstractmethod
    def host(self, m: LRMultiplier, done: int) -> float: ...

    @abstractmethod
    def device(self, m: LRMultiplier, applied: Tensor) -> Tensor: ...


class ConstantDecay(Decay):
    """``constant``: 1."""

    flat = True

    def host(self, m: LRMultiplier, done: int) -> float:
        return 1.0

    def device(self, m: LRMultiplier, applied: Tensor) -> Tensor:
        return torch.ones_like(applied, dtype=torch.float64)


class StepDecay(Decay):
    """``step``: ``gamma ** floor(done / step_size)`` (``torch.optim.lr_scheduler.StepLR``), never settles."""

    holds_last_value = False

    def host(self, m: LRMultiplier, done: int) -> float:
        return m.gamma ** (done // m.step_size)

    def device(self, m: LRMultiplier, applied: Tensor) -> Tensor:
        return torch.pow(m.gamma, torch.div(applied - m.warmup_steps, m.step_size, rounding_mode="floor").double())


class CosineDecay(Decay):
    """``cosine``: ``r + (1 - r) * (1 + cos(pi * p)) / 2`` (one SGDR cycle without restarts)."""

    def host(self, m: LRMultiplier, done: int) -> float:
        r = m.min_lr_ratio
        return r + (1.0 - r) * 0.5 * (1.0 + math.cos(math.pi * m.progress(done)))

    def device(self, m: LRMultiplier, applied: Tensor) -> Tensor:
        r = m.min_lr_ratio
        return r + (1.0 - r) * 0.5 * (1.0 + torch.cos(math.pi * m.progress_on_device(applied)))


class LinearDecay(Decay):
    """``linear``: ``1 - (1 - r) * p``."""

    def host(self, m: LRMultiplier, done: int) -> float:
        return 1.0 - (1.0 - m.min_lr_ratio) * m.progress(done)

    def device(self, m: LRMultiplier, applied: Tensor) -> Tensor:
        return 1.0 - (1.0 - m.min_lr_ratio) * m.progress_on_device(applied)


#: The schedules by their job-spec name (``lr_scheduler.name``).
DECAYS: Mapping[str, Decay] = {
    "constant": ConstantDecay(),
    "cosine": CosineDecay(),
    "linear": LinearDecay(),
    "step": StepDecay(),
}


@dataclass(frozen=True)
class LRMultiplier:
    """The factor on the base learning rate after ``applied`` optimizer steps (host closed form).

    Linear warm-up ``(applied + 1) / warmup_steps`` for the first ``warmup_steps``; then the schedule's
    :class:`Decay` (``DECAYS[name]``), with ``r = min_lr_ratio`` and ``p`` the fraction of the
    ``total_steps - warmup_steps`` decay steps done (clamped to [0, 1]).
    """

    name: str
    total_steps: int
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    step_size: int = 1
    gamma: float = 0.1

    @property
    def decay(self) -> Decay:
        return DECAYS[self.name]

    def progress(self, done: int) -> float:
        """``p``: the fraction of the decay steps done, clamped to at most 1."""
        return min(1.0, done / max(1, self.total_steps - self.warmup_steps))

    def progress_on_device(self, applied: Tensor) -> Tensor:
        done = applied.double() - self.warmup_steps
        return (done / max(1, self.total_steps - self.warmup_steps)).clamp(max=1.0)

    def __call__(self, applied: int) -> float:
        if applied < self.warmup_steps:
            return (applied + 1) / self.warmup_steps
        return self.decay.host(self, applied - self.warmup_steps)

    def on_device(self, applied: Tensor) -> Tensor:
        """The same factor for a 0-d int64 count tensor: a 0-d float64 tensor on its device, no host sync."""
        value = self.decay.device(self, applied)
        if self.warmup_steps == 0:
            return value
        n = applied.double()
        return torch.where(n < self.warmup_steps, (n + 1) / self.warmup_steps, value)


#: Longest schedule kept as a lookup table (float64 entries per param group; 8 MiB each at most).
MAX_TABLE_STEPS = 1 << 20


def is_flat(multiplier: LRMultiplier) -> bool:
    """Whether ``m(n)`` is 1 for every ``n``: a constant schedule without warm-up (the rates never change)."""
    return multiplier.decay.flat and multiplier.warmup_steps == 0


def tabulated(multiplier: LRMultiplier) -> bool:
    """Whether the schedule is a table lookup: ``m`` holds its last value from ``total_steps + 1`` on (not
    ``step``, warm-up within the run) and the table is at most :data:`MAX_TABLE_STEPS` long."""
    return (
        multiplier.decay.holds_last_value
        and multiplier.warmup_steps <= multiplier.total_steps
        and multiplier.total_steps < MAX_TABLE_STEPS
    )


class SchedulerState(TypedDict):
    """:meth:`DeviceLRSchedule.state_dict`: ``LambdaLR``'s keys (a checkpoint's ``lr_scheduler`` entry)."""

    last_epoch: int
    _last_lr: list[float]


class DeviceLRSchedule:
    """Writes ``initial_lr * m(applied)`` into every param group's ``lr`` tensor after each step.

    Args:
        multiplier: the schedule's closed form.
        optimizer: an optimizer from :mod:`trainer.optim.skipping` (groups hold ``initial_lr``
            and a 0-d ``lr`` tensor).

    ``applied`` (0-d int64, on the device of the first group's ``lr``) counts applied steps; the host
    keeps an upper bound of it (the steps attempted since construction or the last load), so a table
    lookup clamps its index only once the count might pass the table's end.
    Construction sets the learning rate of step 1. The rates are the device formula
    (:meth:`LRMultiplier.on_device`) in one of three forms, the same values in each: a
    :func:`is_flat` schedule writes nothing after construction (a host decision: no device
    op); a :func:`tabulated` one looks the rate up in a per-group table of every
    ``initial_lr * m(n)``, computed once (one ``take`` per group and step); any other
    evaluates the formula each step.
    """

    def __init__(self, multiplier: LRMultiplier, optimizer: torch.optim.Optimizer) -> None:
        self.multiplier = multiplier
        self.optimizer = optimizer
        self.device = optimizer.param_groups[0]["params"][0].device
        self.applied = torch.zeros((), dtype=torch.int64, device=self.device)
        self._most_applied = 0  # host upper bound of ``applied``
        self._flat = is_flat(multiplier)
        self._tables = self._build_tables() if not self._flat and tabulated(multiplier) else None
        self._write(initial=True)

    def step(self, applied: Tensor) -> None:
        """Count one attempted step whose ``applied`` flag (0-d, 1 = applied, 0 = skipped) is given; set the next lr.

        A bool flag (a step outcome's) is added as it is: one device op.
        """
        self.applied = self.applied + (applied if applied.dtype == torch.bool else applied.to(torch.int64))
        self._most_applied += 1
        self._write()

    def _build_tables(self) -> list[Tensor]:
        """Per group, ``initial_lr * m(n)`` for ``n`` in ``0..total_steps + 1`` (the last entry holds on)."""
        steps = torch.arange(self.multiplier.total_steps + 2, dtype=torch.int64, device=self.device)
        factors = self.multiplier.on_device(steps)
        return [(group["initial_lr"] * factors).to(lr_dtype(self.device)) for group in self.optimizer.param_groups]

    def _write(self, initial: bool = False) -> None:
        if self._flat and not initial:
            return
        if self._tables is not None:
            last = self.multiplier.total_steps + 1
            index = self.applied if self._most_applied <= last else self.applied.clamp(max=last)
            for group, table in zip(self.optimizer.param_groups, self._tables, strict=True):
                group["lr"] = table.take(index)
            return
        factor = self.multiplier.on_device(self.applied)
        for group in self.optimizer.param_groups:
            lr = group["initial_lr"] * factor
            group["lr"] = lr.to(lr_dtype(lr.device))

    @property
    def last_epoch(self) -> int:
        """Applied steps so far (host read; for checkpoints and tests). The ``LambdaLR`` name."""
        return int(self.applied.item())

    def state_dict(self) -> SchedulerState:
        """``last_epoch`` (applied steps) and ``_last_lr`` (the next step's rates), as python scalars (syncs).

        The keys are ``LambdaLR``'s, so checkpoints keep their format.
        """
        return {
            "last_epoch": self.last_epoch,
            "_last_lr": [float(group["lr"]) for group in self.optimizer.param_groups],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the applied-step count and recompute the learning rates (also from a ``LambdaLR`` state)."""
        self._most_applied = int(state["last_epoch"])
        self.applied = torch.full((), self._most_applied, dtype=torch.int64, device=self.device)
        self._write()


def build_lr_schedule(spec: LRSchedulerSpec, optimizer: torch.optim.Optimizer, total_steps: int) -> DeviceLRSchedule:
    """The device schedule of ``spec`` over ``total_steps`` (the job's ``max_steps``)."""
    multiplier = LRMultiplier(
        name=spec.name,
        total_steps=total_steps,
        warmup_steps=spec.warmup_steps,
        min_lr_ratio=spec.min_lr_ratio,
        step_size=spec.step_size,
        gamma=spec.gamma,
    )
    return DeviceLRSchedule(multiplier, optimizer)
