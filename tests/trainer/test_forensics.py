"""Overflow forensics and underflow telemetry in step records (issue 3, items 6 and 7)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from trainer_support import grad_of, json_records

from halfcast.contracts.spec import JobSpec
from trainer.numerics.forensics import MAX_NAMED_PARAMETERS, describe_overflow
from trainer.numerics.overflow import nonfinite_kinds
from trainer.numerics.precision import build_precision
from trainer.numerics.underflow import underflow_fraction
from trainer.parallel.distributed import DistContext
from trainer.run.loop import train

CPU = torch.device("cpu")


def test_kinds_tell_nan_from_infinity() -> None:
    norms = torch.tensor([1.0, float("inf"), float("nan"), 0.0])
    assert nonfinite_kinds(norms).tolist() == [0.0, 1.0, 2.0, 0.0]


def test_kinds_of_every_finite_norm_are_positive_zero() -> None:
    """The largest and smallest float32 norms, zero and a subnormal: kind +0.0 (a record never shows -0.0)."""
    finite = torch.tensor([torch.finfo(torch.float32).max, 1e-45, 0.0, 0.5, 3.0e38])
    kinds = nonfinite_kinds(torch.cat([finite, torch.tensor([float("inf"), float("nan")])]))
    assert kinds.dtype == torch.float32 and kinds.tolist() == [0.0] * 5 + [1.0, 2.0]
    assert not kinds.signbit().any()


def test_describe_names_the_first_parameters_in_model_order() -> None:
    names = [f"layer{i}.weight" for i in range(MAX_NAMED_PARAMETERS + 3)]
    kinds = [1.0] * (MAX_NAMED_PARAMETERS + 2) + [0.0]
    report = describe_overflow(names, [0.0, 1.0, 2.0], kinds)
    assert report.ranks == [1, 2] and report.count == MAX_NAMED_PARAMETERS + 2
    assert [p["name"] for p in report.parameters] == names[:MAX_NAMED_PARAMETERS]
    assert describe_overflow(["a", "b"], [2.0], [0.0, 2.0]).parameters == [{"name": "b", "kind": "nan"}]


def test_step_names_the_parameter_without_a_gradient_as_clean(tiny_mlp_spec: Callable[..., JobSpec]) -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    policy = build_precision(tiny_mlp_spec(precision="fp16"), CPU)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2, 3)).sum().backward()
    model[0].bias.grad = None  # no gradient: reported clean, the others keep their positions
    grad_of(model[1].get_parameter("weight"))[0, 0] = float("inf")
    outcome = policy.step(optimizer, list(model.parameters()), None)
    assert bool(outcome.overflow)
    assert outcome.param_kinds.tolist() == [0.0, 0.0, 1.0, 0.0] and outcome.rank_kinds.tolist() == [1.0]


def test_underflow_fraction_counts_zero_and_subnormal_fp16_values() -> None:
    tiny = torch.finfo(torch.float16).tiny
    grads = [torch.tensor([0.0, tiny / 4, tiny, 1.0]), torch.tensor([float("inf"), -tiny / 2, 3e-3, 0.5])]
    assert underflow_fraction(grads, CPU).item() == 3 / 8
    assert math.isnan(underflow_fraction([], CPU).item())


def test_overflow_records_name_parameter_kind_and_rank(
    tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext, tmp_path: Path
) -> None:
    spec = tiny_mlp_spec(
        precision="fp16", max_steps=6, log_interval=4, faults={"nonfinite_grad_steps": [2, 5], "nonfinite_value": "nan"}
    )
    train(spec, tmp_path, cpu_ctx)
    steps = {r["step"]: r for r in json_records(tmp_path) if r["type"] == "step"}
    for step in (2, 5):
        assert steps[step]["overflow"] and steps[step]["overflow_ranks"] == [0]
        assert steps[step]["nonfinite_params"] == [{"name": _first_parameter(spec), "kind": "nan"}]
        assert steps[step]["nonfinite_param_count"] == 1
    clean = [r for s, r in steps.items() if s not in (2, 5)]
    assert all(r["overflow_ranks"] is None and r["nonfinite_params"] is None for r in clean)


def test_underflow_is_sampled_every_interval_in_fp16_only(
    tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext, tmp_path: Path
) -> None:
    spec = tiny_mlp_spec(precision="fp16", max_steps=6, loss_scale={"init_scale": 1.0, "underflow_sample_interval": 2})
    train(spec, tmp_path / "fp16", cpu_ctx)
    fractions = {r["step"]: r["underflow_fraction"] for r in json_records(tmp_path / "fp16") if r["type"] == "step"}
    assert all(fractions[s] is None for s in (1, 3, 5))
    assert all(fractions[s] is not None and 0.0 <= fractions[s] <= 1.0 for s in (2, 4, 6))
    train(tiny_mlp_spec(precision="bf16", max_steps=2), tmp_path / "bf16", cpu_ctx)
    assert all(r.get("underflow_fraction") is None for r in json_records(tmp_path / "bf16") if r["type"] == "step")


def test_a_higher_scale_lowers_the_underflow_fraction(
    tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext, tmp_path: Path
) -> None:
    fractions = []
    for scale in (1.0, 2.0**16):
        spec = tiny_mlp_spec(
            precision="fp16", max_steps=1, loss_scale={"init_scale": scale, "underflow_sample_interval": 1}
        )
        train(spec, tmp_path / str(scale), cpu_ctx)
        fractions.append(
            next(r for r in json_records(tmp_path / str(scale)) if r["type"] == "step")["underflow_fraction"]
        )
    assert fractions[1] < fractions[0]


def _first_parameter(spec: JobSpec) -> str:
    from trainer.data import build_dataset
    from trainer.models import build_model

    model = build_model(spec.model, build_dataset(spec.dataset).info)
    return next(name for name, p in model.named_parameters() if p.requires_grad)
