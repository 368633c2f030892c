"""Precision policies: step-or-skip, untouched state on overflow, clipping, support checks, C09."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from trainer_support import grad_of, spawn_ranks

from halfcast.contracts.spec import JobSpec, LossScaleSpec
from trainer.numerics.precision import PrecisionPolicy, PrecisionUnsupportedError, build_precision, build_scaler
from trainer.parallel.distributed import DistContext

CPU = torch.device("cpu")


def _spec(precision: str, **extra: object) -> JobSpec:
    return JobSpec.model_validate(
        {"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "precision": precision, **extra}
    )


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


def _backward(policy: PrecisionPolicy, model: nn.Module, scale: float = 1.0) -> None:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    with policy.autocast():
        loss = model(x).float().pow(2).mean() * scale
    policy.backward(loss)


@pytest.mark.parametrize("optimizer_name", ["adamw_plain", "adamw_foreach", "adamw_fused", "sgd"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_overflow_leaves_parameters_and_optimizer_state_untouched(precision: str, optimizer_name: str) -> None:
    model = _model()
    policy = build_precision(_spec(precision), CPU)
    optimizer = _optimizer(optimizer_name, model)
    _backward(policy, model)
    first = policy.step(optimizer, list(model.parameters()), None)
    assert first.applied and not first.overflow
    optimizer.zero_grad(set_to_none=True)
    params, state = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    scale_before = policy.loss_scale

    _backward(policy, model)
    grad_of(next(model.parameters())).view(-1)[0] = float("nan")
    outcome = policy.step(optimizer, list(model.parameters()), max_grad_norm=1.0).to_host()

    assert outcome.overflow and not outcome.applied and outcome.grad_norm is None
    assert outcome.loss_scale == scale_before and outcome.skipped_steps == 1
    for name, value in model.state_dict().items():
        assert torch.equal(value, params[name]), name
    assert str(optimizer.state_dict()) == str(state)
    expected_scale = scale_before / 2 if precision == "fp16" else 1.0
    assert policy.loss_scale == expected_scale


def _optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    kind = name.split("_")[1]
    flags: dict[str, Any] = {"plain": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[kind]
    return torch.optim.AdamW(model.parameters(), lr=1e-3, **flags)


def test_fp16_gradients_are_unscaled_before_the_step_and_norm_is_pre_clip() -> None:
    model = _model()
    reference = copy.deepcopy(model)
    policy = build_precision(_spec("fp16", loss_scale={"init_scale": 1024.0}), CPU)
    _backward(policy, model)
    _backward(build_precision(_spec("fp32"), CPU), reference)
    expected_norm = torch.nn.utils.get_total_norm([grad_of(p) for p in reference.parameters()]).item()

    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    outcome = policy.step(optimizer, list(model.parameters()), max_grad_norm=1e-3)

    assert outcome.loss_scale == 1024.0
    assert outcome.grad_norm == pytest.approx(expected_norm, rel=1e-2)
    clipped = torch.nn.utils.get_total_norm([grad_of(p) for p in model.parameters()]).item()
    assert clipped == pytest.approx(1e-3, rel=1e-3)


def test_autocast_dtypes() -> None:
    x, layer = torch.randn(2, 4), nn.Linear(4, 4)
    for precision, dtype in [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)]:
        with build_precision(_spec(precision), CPU).autocast():
            assert layer(x).dtype == dtype


def test_fp8_is_rejected_without_a_capable_gpu_never_downgraded() -> None:
    spec = _spec("fp8", gpus=1)
    with pytest.raises(PrecisionUnsupportedError, match="compute capability"):
        build_precision(spec, CPU)


def test_scaler_kind_follows_the_spec() -> None:
    assert type(build_scaler(None, CPU)).__name__ == "NoOpLossScaler"
    assert build_scaler(LossScaleSpec(mode="static", init_scale=8.0), CPU).scale.item() == 8.0
    assert build_scaler(LossScaleSpec(mode="static", static_scale=4.0), CPU).scale.item() == 4.0
    assert type(build_scaler(LossScaleSpec(), CPU)).__name__ == "DynamicLossScaler"


def test_state_dict_round_trip_and_precision_mismatch() -> None:
    policy = build_precision(_spec("fp16", loss_scale={"init_scale": 256.0, "growth_interval": 3}), CPU)
    model, optimizer = _model(), None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(2):
        _backward(policy, model)
        policy.step(optimizer, list(model.parameters()), None)
        optimizer.zero_grad()
    state = policy.state_dict()
    restored = build_precision(_spec("fp16", loss_scale={"init_scale": 256.0, "growth_interval": 3}), CPU)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    with pytest.raises(ValueError, match="precision"):
        build_precision(_spec("bf16"), CPU).load_state_dict(state)


# ----------------------------------------------------------------------------- C09


def _c09_rank(ctx: DistContext, out_dir: str) -> None:
    rank = ctx.rank
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
    spec = _spec("fp16", loss_scale={"init_scale": 1024.0})
    policy = build_precision(spec, CPU)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(rank))
    with policy.autocast():
        loss = model(x).float().mean()
    policy.backward(loss)  # DDP all-reduces gradients here
    if rank == 1:
        model.module.weight.grad[0, 0] = float("nan")
    outcome = policy.step(optimizer, list(model.parameters()), None)
    unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    torch.save(
        {
            "skipped": outcome.overflow,
            "scale": policy.loss_scale,
            "unchanged": unchanged,
            "rank_kinds": outcome.rank_kinds.tolist(),
            "param_kinds": outcome.param_kinds.tolist(),
            "params": [p.detach() for p in model.parameters()],
        },
        Path(out_dir) / f"rank{rank}.pt",
    )


def test_overflow_on_one_rank_is_an_overflow_on_all_ranks(tmp_path: Path) -> None:
    """Field case C09 (pytorch/pytorch PR #115710): NaN on one rank (1) only, after the all-reduce."""
    spawn_ranks(_c09_rank, str(tmp_path))
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for result in results:
        assert result["skipped"] and result["unchanged"] and result["scale"] == 512.0
        # forensics: both ranks agree that rank 1 held a NaN, in the weight only
        assert result["rank_kinds"] == [0.0, 2.0] and result["param_kinds"] == [2.0, 0.0]
    for a, b in zip(results[0]["params"], results[1]["params"], strict=True):
        assert torch.equal(a, b)
