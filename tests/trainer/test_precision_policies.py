"""The precision policy classes and the step's optional observers (issue 14 item 3)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from trainer_support import grad_of

from halfcast.contracts.spec import JobSpec, Precision
from trainer.numerics import precision
from trainer.numerics.forensics import OverflowForensics
from trainer.numerics.loss_scale import DynamicLossScaler, NoOpLossScaler, StaticLossScaler
from trainer.numerics.observers import Gradients, StepObservers
from trainer.numerics.precision import (
    Fp8Precision,
    Fp16Precision,
    PlainPrecision,
    build_precision,
    build_scaler,
)
from trainer.numerics.underflow import UnderflowSampler

CPU = torch.device("cpu")


def _spec(name: str, **extra: object) -> JobSpec:
    return JobSpec.model_validate(
        {"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "precision": name, **extra}
    )


def test_the_factory_builds_one_policy_class_per_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "check_supported", lambda name, device: None)
    fp32, bf16 = build_precision(_spec("fp32"), CPU), build_precision(_spec("bf16"), CPU)
    fp16 = build_precision(_spec("fp16"), CPU)
    static = build_precision(
        _spec("fp16", loss_scale={"mode": "static", "init_scale": 8.0, "underflow_sample_interval": None}), CPU
    )
    fp8 = build_precision(_spec("fp8", gpus=1, fp8_recipe="rowwise"), CPU)
    assert type(fp32) is PlainPrecision and type(bf16) is PlainPrecision
    assert type(fp16) is Fp16Precision and type(static) is Fp16Precision and type(fp8) is Fp8Precision
    assert [p.compute_dtype for p in (fp32, bf16, fp16, fp8)] == [
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.bfloat16,
    ]
    assert isinstance(fp16.scaler, DynamicLossScaler) and isinstance(static.scaler, StaticLossScaler)
    assert all(isinstance(p.scaler, NoOpLossScaler) for p in (fp32, bf16, fp8))
    assert isinstance(fp8, Fp8Precision) and fp8.recipe == "rowwise"
    # every job has forensics; only fp16 with an interval samples underflow
    assert all(isinstance(p.observers.forensics, OverflowForensics) for p in (fp32, bf16, fp16, static, fp8))
    assert isinstance(fp16.observers.underflow, UnderflowSampler) and fp16.observers.underflow.interval == 100
    assert all(p.observers.underflow is None for p in (fp32, bf16, static, fp8))
    assert fp32.start_fields() == {} and fp16.fp8_layers == [] and fp8.start_fields() == {"fp8_layers": []}
    with pytest.raises(ValueError, match="fp32 or bf16"):
        PlainPrecision("fp16", CPU)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def _run(policy: precision.PrecisionPolicy, steps: int = 4) -> tuple[list[Tensor], list[precision.StepOutcome]]:
    """``steps`` steps on one model, a NaN injected at step 2, a parameter without a gradient at step 3."""
    model = _model()
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True)
    outcomes = []
    for step in range(1, steps + 1):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        with policy.autocast():
            loss = model(x).float().square().mean()
        policy.backward(loss)
        if step == 2:
            grad_of(params[2]).view(-1)[0] = float("nan")
        if step == 3:
            params[1].grad = None
        outcomes.append(policy.step(optimizer, params, 1.0, step=step))
        optimizer.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in params], outcomes


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16"])
def test_observers_watch_and_never_decide(name: Precision) -> None:
    """Without observers the step skips, clips, steps and scales bit for bit alike; only their findings are missing."""
    scaling = {"loss_scale": {"init_scale": 256.0, "underflow_sample_interval": 1}} if name == "fp16" else {}
    watched = build_precision(_spec(name, **scaling), CPU)
    if name == "fp16":
        bare: precision.PrecisionPolicy = Fp16Precision(
            CPU, build_scaler(_spec(name, **scaling).effective_loss_scale, CPU)
        )
    else:
        bare = PlainPrecision(name, CPU)
    assert bare.observers == StepObservers()
    params, outcomes = _run(watched)
    bare_params, bare_outcomes = _run(bare)
    assert all(torch.equal(a, b) for a, b in zip(params, bare_params, strict=True))
    for seen, unseen in zip(outcomes, bare_outcomes, strict=True):
        for field in ("overflow", "applied", "overflow_kind", "loss_scale", "grad_norm", "skipped_steps", "rank_kinds"):
            a, b = getattr(seen, field), getattr(unseen, field)
            assert torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True), field  # bit for bit, NaN norms alike
        assert unseen.param_kinds.numel() == 0 and torch.isnan(unseen.underflow_fraction)
        assert seen.param_kinds.numel() == len(params)
    assert [o.param_kinds.tolist() for o in outcomes[1:3]] == [[0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    sampled = [not torch.isnan(o.underflow_fraction) for o in outcomes]
    assert sampled == [name == "fp16"] * 4


class _Recorder:
    """An observer at both points: what the step showed it, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []  # each point's arguments, as the step passed them

    def before_unscale(self, step: int | None, grads: Sequence[Tensor]) -> Tensor | None:
        self.calls.append(("before_unscale", (step, [g.clone() for g in grads])))
        return torch.tensor(0.25) if step == 2 else None

    def evidence(self, values: Tensor, grads: Gradients) -> Tensor:
        self.calls.append(("evidence", (values.clone(), grads.present, grads.count)))
        return torch.tensor([7.0])


def test_observers_are_called_at_their_points_with_the_scaled_gradients() -> None:
    recorder = _Recorder()
    policy = Fp16Precision(CPU, StaticLossScaler(64.0), StepObservers(underflow=recorder, forensics=recorder))
    model = _model()
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.0, fused=True)
    for step in (1, 2):
        with policy.autocast():
            loss = model(torch.ones(2, 8)).float().sum()
        policy.backward(loss)
        params[3].grad = None
        scaled = [grad_of(p).clone() for p in params[:3]]
        outcome = policy.step(optimizer, params, None, step=step)
        unscaled = [grad_of(p) for p in params[:3]]
        assert all(torch.equal(s / 64.0, u) for s, u in zip(scaled, unscaled, strict=True))
        (point, (seen_step, seen)), (second, (values, present, count)) = recorder.calls[-2:]
        assert (point, second, seen_step) == ("before_unscale", "evidence", step)
        assert all(torch.equal(s, g) for s, g in zip(scaled, seen, strict=True))  # before unscaling
        # one process: each existing gradient's norm (its NaN or infinity is its kind), not kinds
        assert torch.equal(values, torch.stack(torch._foreach_norm(unscaled))) and present == [0, 1, 2] and count == 4
        assert outcome.param_evidence.tolist() == [7.0]  # the observer's evidence is the step's
        assert outcome.underflow_fraction.item() == 0.25 if step == 2 else torch.isnan(outcome.underflow_fraction)
        optimizer.zero_grad(set_to_none=True)
    assert len(recorder.calls) == 4


def test_the_underflow_sampler_samples_multiples_of_its_interval_only() -> None:
    sampler = UnderflowSampler(3, CPU)
    grads = [torch.tensor([0.0, 1.0])]
    assert [sampler.before_unscale(step, grads) is not None for step in (None, 1, 2, 3, 6, 7)] == [
        False,
        False,
        False,
        True,
        True,
        False,
    ]
    sampled = sampler.before_unscale(3, grads)
    assert sampled is not None and sampled.item() == 0.5
    with pytest.raises(ValueError):
        UnderflowSampler(0, CPU)


def test_an_fp8_policy_owns_its_conversion() -> None:
    policy = Fp8Precision(CPU)
    model = policy.prepare_model(nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)))
    assert policy.fp8_layers == ["1"] and policy.start_fields() == {"fp8_layers": policy.fp8_report}
    assert isinstance(model, nn.Sequential) and type(model[1]).__name__ == "Float8EmulatedLinear"
