"""Optimizers from the spec and the learning-rate schedules over applied steps (device-side, trainer/optim/schedule.py)."""

from __future__ import annotations

import math

import pytest
import torch

from halfcast.contracts.spec import LRSchedulerSpec, OptimizerSpec
from trainer.optim.build import LRMultiplier, build_lr_scheduler, build_optimizer


def _params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(3))]


@pytest.mark.parametrize(
    ("implementation", "flag", "value"),
    [("plain", "foreach", False), ("foreach", "foreach", True), ("fused", "fused", True), ("auto", "fused", True)],
)
def test_implementation_flags(implementation: str, flag: str, value: bool | None) -> None:
    """``auto`` picks the fused kernels where the device has them (CPU here): the fastest sync-free path."""
    for name in ("adamw", "sgd"):
        optimizer = build_optimizer(OptimizerSpec(name=name, implementation=implementation), _params())
        assert optimizer.defaults[flag] is value
        assert getattr(optimizer, "_step_supports_amp_scaling", False)


def test_optimizer_hyperparameters() -> None:
    adamw = build_optimizer(OptimizerSpec(name="adamw", lr=0.5, betas=(0.8, 0.9), weight_decay=0.1), _params())
    assert isinstance(adamw, torch.optim.AdamW) and adamw.defaults["betas"] == (0.8, 0.9)
    sgd = build_optimizer(OptimizerSpec(name="sgd", lr=0.5, momentum=0.9), _params())
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["momentum"] == 0.9 and sgd.defaults["lr"] == 0.5


def test_schedule_shapes() -> None:
    step = LRMultiplier("step", total_steps=10, step_size=2, gamma=0.5)
    assert [step(i) for i in range(5)] == [1.0, 1.0, 0.5, 0.5, 0.25]
    warm = LRMultiplier("linear", total_steps=12, warmup_steps=2, min_lr_ratio=0.2)
    assert [warm(0), warm(1), warm(2)] == [0.5, 1.0, 1.0]
    assert warm(7) == pytest.approx(0.6) and warm(12) == pytest.approx(0.2) and warm(50) == pytest.approx(0.2)
    cosine = LRMultiplier("cosine", total_steps=10, min_lr_ratio=0.1)
    assert cosine(0) == 1.0 and cosine(5) == pytest.approx(0.55) and cosine(10) == pytest.approx(0.1)
    assert LRMultiplier("constant", total_steps=10, warmup_steps=4)(2) == 0.75
    assert LRMultiplier("constant", total_steps=10)(9) == 1.0


def test_device_schedule_follows_applied_steps_and_round_trips() -> None:
    params = _params()
    optimizer = build_optimizer(OptimizerSpec(name="sgd", lr=1.0), params)
    scheduler = build_lr_scheduler(LRSchedulerSpec(name="cosine"), optimizer, total_steps=4)
    for applied in (1.0, 0.0, 1.0):  # a skipped step in the middle does not count
        scheduler.step(torch.tensor(applied))
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * (1 + math.cos(math.pi / 2)))
    assert scheduler.last_epoch == 2 and scheduler.state_dict()["last_epoch"] == 2
    other_optimizer = build_optimizer(OptimizerSpec(name="sgd", lr=1.0), _params())
    other = build_lr_scheduler(LRSchedulerSpec(name="cosine"), other_optimizer, 4)
    other.load_state_dict(scheduler.state_dict())
    assert other.last_epoch == 2 and other_optimizer.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
