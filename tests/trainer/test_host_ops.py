"""The fixed host cost of a step: the fused forms compute exactly what the general ones do, in fewer ops."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

import trainer.numerics.precision as precision_module
from bench.op_counter import OpCounter
from halfcast.contracts.spec import JobSpec
from trainer.components import build_components, build_record_flusher
from trainer.numerics.loss_scale import DynamicLossScaler
from trainer.parallel.distributed import DistContext
from trainer.records import RecordSink
from trainer.run.step import record_step, train_step


@pytest.mark.parametrize("consecutive", [False, True])
def test_fused_scale_update_keeps_the_general_rules_state_bit_for_bit(consecutive: bool) -> None:
    """Scale, growth and hysteresis trackers after every step of a random pattern, with bounds reached."""
    kwargs: dict[str, Any] = {
        "init_scale": 2.0**20,
        "growth_interval": 3,
        "backoff_factor": 0.25,
        "max_scale": 2.0**22,
        "min_scale": 4.0,
        "consecutive_hysteresis": consecutive,
    }
    fused, general = DynamicLossScaler(**kwargs), DynamicLossScaler(**kwargs)
    general._fused_update = False
    assert fused._fused_update
    rng = random.Random(5)
    for _ in range(200):
        flag = torch.tensor(1.0 if rng.random() < 0.3 else 0.0)
        fused.update(flag)
        general.update(flag)
        assert fused.state_dict() == general.state_dict()


def test_one_process_check_equals_the_cross_rank_one(cpu_ctx: DistContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """An inf in one gradient and a NaN in another: same kind, evidence and skip on both paths."""
    outcomes = []
    for distributed in (False, True):
        monkeypatch.setattr(precision_module, "is_distributed", lambda d=distributed: d)
        policy = precision_module.build_precision(
            JobSpec.model_validate({"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "precision": "fp16"}),
            cpu_ctx.device,
        )
        params = [torch.nn.Parameter(torch.ones(3)) for _ in range(3)]
        for p, value in zip(params, (1.0, float("inf"), float("nan")), strict=True):
            p.grad = torch.full((3,), value)
        outcome = policy.step(torch.optim.SGD(params, lr=0.1), params, 1.0)
        outcomes.append(
            (
                outcome.overflow_kind.item(),
                outcome.rank_kinds.tolist(),
                outcome.param_kinds.tolist(),
                outcome.applied.item(),
                policy.loss_scale,
            )
        )
    assert outcomes[0] == outcomes[1] == (2.0, [2.0], [0.0, 1.0, 2.0], 0.0, 32768.0)


@pytest.mark.parametrize(("precision", "budget"), [("fp32", 55), ("bf16", 66), ("fp16", 76)])
def test_a_steady_step_and_its_row_stay_within_their_op_budget(
    precision: str, budget: int, tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext
) -> None:
    """Dispatched aten ops of one step plus its telemetry row (the tiny MLP; the hand loop: 47/58/71)."""
    spec = tiny_mlp_spec(
        precision=precision, max_grad_norm=1.0, lr_scheduler={"name": "cosine", "warmup_steps": 2}, max_steps=50
    )
    parts = build_components(spec, cpu_ctx)
    flusher = build_record_flusher(spec, parts, RecordSink(None), cpu_ctx)
    stream = parts.dataset.train_batches(16, rank=0, world_size=1, seed=0)
    for step in (1, 2):
        with OpCounter() as ops:
            result = train_step(parts, [next(stream)], step=step, max_grad_norm=1.0, dist_ctx=cpu_ctx)
            record_step(flusher.step_log, step, result)
    assert ops.total <= budget, ops.counts.most_common(12)


def test_a_fused_step_runs_its_hooks_once_when_plain_torch_optimizers_exist() -> None:
    """A plain ``torch.optim.AdamW`` instance makes PyTorch wrap that class's ``step``; Halfcast's fused
    step calls it unwrapped (its own ``step`` is wrapped already), so a step hook runs once."""
    from trainer.optim.skipping import AdamW

    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])  # wraps torch.optim.AdamW.step
    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.ones(2)
    optimizer = AdamW([param], lr=0.1, implementation="fused")
    calls: list[int] = []
    optimizer.register_step_pre_hook(lambda *_: calls.append(1))
    optimizer.step()
    assert calls == [1] and not torch.equal(param.detach(), torch.ones(2))
