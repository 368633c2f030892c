"""Divergence guard: consecutive skipped steps and non-finite losses end the job with a typed reason."""

from __future__ import annotations

import math

import pytest

from trainer.errors import TrainerError
from trainer.guard import DivergenceGuard


def test_consecutive_skips_fail_and_a_clean_step_resets() -> None:
    guard = DivergenceGuard(max_skips=3, max_nonfinite_losses=10)
    for step, overflow in enumerate([True, True, False, True, True], start=1):
        guard.update(step, overflow, 1.0)
    with pytest.raises(TrainerError) as info:
        guard.update(6, True, 1.0)
    assert info.value.reason == "nonfinite_gradients" and "3 consecutive" in info.value.message


def test_consecutive_nonfinite_losses_fail() -> None:
    guard = DivergenceGuard(max_skips=10, max_nonfinite_losses=2)
    guard.update(1, False, math.nan)
    guard.update(2, False, 0.5)
    guard.update(3, False, math.inf)
    with pytest.raises(TrainerError) as info:
        guard.update(4, False, math.nan)
    assert info.value.reason == "nonfinite_loss"
    assert guard.state_dict() == {"consecutive_skips": 0, "consecutive_nonfinite_losses": 2}


def test_unknown_reasons_are_refused() -> None:
    with pytest.raises(ValueError):
        TrainerError("oops", "not a reason")
