"""The device-side LR schedule equals the closed form and LambdaLR over applied steps, without host reads."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR

from halfcast.contracts.spec import LRSchedulerSpec, OptimizerSpec
from trainer.optim.build import build_lr_scheduler, build_optimizer
from trainer.optim.schedule import LRMultiplier

SCHEDULES = [
    LRMultiplier("constant", total_steps=50),
    LRMultiplier("constant", total_steps=50, warmup_steps=7),
    LRMultiplier("linear", total_steps=50, warmup_steps=5, min_lr_ratio=0.2),
    LRMultiplier("linear", total_steps=50),
    LRMultiplier("cosine", total_steps=50, warmup_steps=10, min_lr_ratio=0.1),
    LRMultiplier("cosine", total_steps=37),
    LRMultiplier("step", total_steps=50, warmup_steps=3, step_size=4, gamma=0.5),
    LRMultiplier("step", total_steps=50, step_size=1, gamma=0.3),
]


@pytest.mark.parametrize("multiplier", SCHEDULES, ids=lambda m: f"{m.name}-w{m.warmup_steps}")
def test_device_multiplier_equals_the_closed_form(multiplier: LRMultiplier) -> None:
    """Exact (bit for bit) except cosine, where the device cos may differ from libm by one ulp; past the end too."""
    for applied in range(0, multiplier.total_steps + 6):
        device = multiplier.on_device(torch.tensor(applied, dtype=torch.int64))
        assert device.dtype == torch.float64 and device.dim() == 0
        expected = multiplier(applied)
        if multiplier.name == "cosine":
            assert float(device) == pytest.approx(expected, rel=0.0, abs=2 * math.ulp(1.0)), applied
        else:
            assert float(device) == expected, applied


@pytest.mark.parametrize("name", ["constant", "linear", "step"])
def test_learning_rates_equal_lambda_lr_over_applied_steps(name: str) -> None:
    """The same applied/skipped pattern through LambdaLR (stepped on the host only when applied) and the
    device schedule (stepped by the flag) gives the same lr, bit for bit, at every step."""
    spec = LRSchedulerSpec(name=name, warmup_steps=3, min_lr_ratio=0.25, step_size=2, gamma=0.5)
    total = 20
    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = build_optimizer(OptimizerSpec(name="sgd", lr=0.3), params)
    schedule = build_lr_scheduler(spec, optimizer, total)
    reference_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.3)
    reference = LambdaLR(reference_opt, schedule.multiplier)
    pattern = [step % 4 != 1 for step in range(total)]
    for applied in pattern:
        assert float(optimizer.param_groups[0]["lr"]) == reference_opt.param_groups[0]["lr"]
        schedule.step(torch.tensor(1.0 if applied else 0.0))
        if applied:
            reference_opt.step()
            reference.step()
    assert schedule.last_epoch == sum(pattern) == reference.last_epoch


def test_cosine_decays_to_min_lr_ratio_and_stays() -> None:
    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = build_optimizer(OptimizerSpec(name="adamw", lr=1e-3), params)
    schedule = build_lr_scheduler(LRSchedulerSpec(name="cosine", warmup_steps=2, min_lr_ratio=0.1), optimizer, 10)
    rates = []
    for _ in range(14):
        rates.append(float(optimizer.param_groups[0]["lr"]))
        schedule.step(torch.tensor(1.0))
    assert rates[:3] == pytest.approx([0.5e-3, 1e-3, 1e-3])
    assert rates[10:] == pytest.approx([1e-4] * 4)
    assert all(a >= b for a, b in itertools.pairwise(rates[2:]))


def test_bool_flags_count_and_a_count_past_the_table_holds_the_last_rate() -> None:
    """A step outcome's bool ``applied`` counts like a float flag; a checkpointed count beyond the run
    (its table's end) keeps the last rate instead of indexing past the table."""
    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = build_optimizer(OptimizerSpec(name="adamw", lr=1e-3), params)
    schedule = build_lr_scheduler(LRSchedulerSpec(name="linear", min_lr_ratio=0.25), optimizer, 4)
    for applied in (True, False, True):
        schedule.step(torch.tensor(applied))
    assert schedule.last_epoch == 2 and float(optimizer.param_groups[0]["lr"]) == pytest.approx(0.625e-3)
    schedule.load_state_dict({"last_epoch": 9})
    schedule.step(torch.tensor(True))
    assert schedule.last_epoch == 10 and float(optimizer.param_groups[0]["lr"]) == pytest.approx(0.25e-3)
