"""Fault injection: non-finite gradients on chosen steps and ranks, sleep, kill, raise."""

from __future__ import annotations

import math
import signal

import pytest
import torch
from trainer_support import grad_of

from halfcast.contracts.spec import FaultsSpec
from trainer import faults as faults_module
from trainer.faults import FaultInjector


def _params() -> list[torch.nn.Parameter]:
    first, second = torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(3))
    second.grad = torch.ones(3)
    return [first, second]  # the first parameter has no gradient


def test_nonfinite_gradient_on_listed_steps_and_ranks() -> None:
    spec = FaultsSpec(nonfinite_grad_steps=[2], nonfinite_value="nan", ranks=[1])
    params = _params()
    FaultInjector(spec, rank=0).after_backward(2, params)
    FaultInjector(spec, rank=1).after_backward(1, params)
    assert torch.equal(grad_of(params[1]), torch.ones(3))
    FaultInjector(spec, rank=1).after_backward(2, params)
    assert math.isnan(grad_of(params[1])[0].item()) and grad_of(params[1])[1:].tolist() == [1.0, 1.0]


def test_nonfinite_gradient_on_every_step_from_one_on() -> None:
    """C11 as a spec: ``nonfinite_grad_from_step`` poisons that step and every later one, with the listed steps."""
    spec = FaultsSpec(nonfinite_grad_steps=[1], nonfinite_grad_from_step=5)
    hit = []
    for step in range(1, 9):
        params = _params()
        FaultInjector(spec, rank=0).after_backward(step, params)
        hit.append(grad_of(params[1])[0].item() == math.inf)
    assert hit == [True, False, False, False, True, True, True, True]


def test_default_is_inf_on_every_rank_and_none_is_off() -> None:
    params = _params()
    FaultInjector(None, rank=0).after_backward(1, params)
    assert torch.equal(grad_of(params[1]), torch.ones(3))
    FaultInjector(FaultsSpec(nonfinite_grad_steps=[1]), rank=5).after_backward(1, params)
    assert grad_of(params[1])[0].item() == math.inf


def test_step_start_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    kills: list[tuple[int, int]] = []
    monkeypatch.setattr(faults_module.time, "sleep", sleeps.append)
    monkeypatch.setattr(faults_module.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    spec = FaultsSpec(sleep_per_step_s=0.5, kill_at_step={"step": 2, "rank": 1, "signal": "SIGTERM"}, raise_at_step=3)
    FaultInjector(spec, rank=0).at_step_start(2)
    assert kills == [] and sleeps == [0.5]
    FaultInjector(spec, rank=1).at_step_start(2)
    assert [sig for _, sig in kills] == [signal.SIGTERM]
    with pytest.raises(RuntimeError, match="raise_at_step 3"):
        FaultInjector(spec, rank=0).at_step_start(3)
