"""Variants of the numerics field cases C01-C17 (../shared/cases): the same kinds of fault on inputs the
case tests do not use (other schedules, optimizer paths, precisions, ranks, accumulation, bounds).

Each test's docstring names the case it varies. The two-rank variants (C08, C09, C17) run together
in one gloo spawn (:func:`two_rank_runs`), each scenario on its own, and are marked ``slow``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
import torch
import torch.distributed as dist
from pydantic import ValidationError
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from trainer_support import grad_of, json_records, lm_micro_batch, spawn_ranks, tiny_lm

from halfcast.contracts.spec import JobSpec, LossScaleSpec, OptimizerSpec
from trainer.components import Components, build_components
from trainer.data import Batch, Task
from trainer.data.base import Dataset, feature_batch, token_batch
from trainer.errors import TrainerError
from trainer.losses import task_loss
from trainer.numerics.loss_scale import DynamicLossScaler, DynamicScalerState, StaticLossScaler
from trainer.numerics.precision import build_precision, build_scaler
from trainer.optim.build import build_lr_scheduler, build_optimizer
from trainer.optim.skipping import DeviceSkipOptimizer
from trainer.parallel.distributed import DistContext
from trainer.parallel.wrap import grad_sync, unwrap_model, wrap_model
from trainer.run import loop
from trainer.run.checkpoint import final_path, load_checkpoint, step_path
from trainer.run.loop import train
from trainer.run.step import StepResult, accumulate_window, train_step

log = logging.getLogger(__name__)

CPU = torch.device("cpu")
#: Every optimizer path of trainer.optim.skipping (all six run on CPU).
PATHS = [(name, impl) for name in ("sgd", "adamw") for impl in ("plain", "foreach", "fused")]
#: Record fields that depend on wall time, not on the numerics.
TIMING_FIELDS = ("time", "samples_per_second", "tokens_per_second")

SpecFactory = Callable[..., JobSpec]


# ----------------------------------------------------------------------------- helpers


def _optimizer(name: str, implementation: str, lr: float = 0.05) -> dict[str, Any]:
    """An optimizer block that exercises every piece of state: SGD momentum + weight decay, AdamW weight decay."""
    extra: dict[str, Any] = {"momentum": 0.9} if name == "sgd" else {}
    return {"name": name, "lr": lr, "implementation": implementation, "weight_decay": 0.01, **extra}


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in json_records(run_dir) if r["type"] == "step"]


def _numerics(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Step records without their wall-time fields."""
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


def _bits(tensor: Tensor) -> Tensor:
    """The raw bytes of ``tensor`` (so -0.0 differs from +0.0 and NaN payloads count)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_bit_identical(a: Any, b: Any, where: str = "") -> None:
    """Nested dicts/lists/tuples of tensors and scalars are equal, tensors bit for bit (dtype and shape too)."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        assert isinstance(a, Tensor) and isinstance(b, Tensor), where
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        assert torch.equal(_bits(a), _bits(b)), where
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping) and set(a) == set(b), where
        for key in a:
            assert_bit_identical(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_bit_identical(x, y, f"{where}[{index}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@contextlib.contextmanager
def captured_components() -> Iterator[list[Components]]:
    """Every :class:`Components` that :func:`trainer.run.loop.train` builds while the context is open."""
    built: list[Components] = []
    original = loop.build_components

    def capture(spec: JobSpec, dist_ctx: DistContext, **options: Any) -> Components:
        parts = original(spec, dist_ctx, **options)
        built.append(parts)
        return parts

    with pytest.MonkeyPatch.context() as patch:  # undone on leaving, as the original is put back
        patch.setattr(loop, "build_components", capture)
        yield built


def _full_params(model: nn.Module) -> list[Tensor]:
    """Every parameter in full (a collective for FSDP2 DTensors), detached copies."""
    return [p.full_tensor() if isinstance(p, DTensor) else p.detach().clone() for p in model.parameters()]


def _snapshot(parts: Components) -> dict[str, Any]:
    """Model, optimizer, schedule and precision state of ``parts`` (copies)."""
    return {
        "model": {k: v.clone() for k, v in parts.model.state_dict().items()},
        "optimizer": _clone_nested(parts.optimizer.state_dict()),
        "schedule": parts.lr_scheduler.state_dict(),
        # the empty-window count is the one thing an empty window changes (by design): compared on its own
        "precision": {k: v for k, v in parts.precision.state_dict().items() if k != "empty_windows"},
    }


def _clone_nested(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, Mapping):
        return {k: _clone_nested(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_clone_nested(v) for v in value)
    return value


def _lm_parts(precision: str, ctx: DistContext, **spec_fields: Any) -> Components:
    """Components around the C17 tiny causal LM (vocab 32, embedding 16), wrapped for ``ctx``."""
    spec = JobSpec.model_validate(
        {
            "model": {"name": "gpt"},
            "dataset": {"name": "text"},
            "precision": precision,
            "max_steps": 10,
            "optimizer": {"name": "adamw", "lr": 0.01, "weight_decay": 0.1},
            "lr_scheduler": {"name": "cosine", "warmup_steps": 2},
            **spec_fields,
        }
    )
    model = tiny_lm()
    optimizer = build_optimizer(spec.optimizer, model.parameters())
    return Components(
        dataset=cast(Dataset, None),  # train_step never reads it
        model=model,
        train_model=wrap_model(model, ctx),
        precision=build_precision(spec, ctx.device),
        optimizer=optimizer,
        lr_scheduler=build_lr_scheduler(spec.lr_scheduler, optimizer, spec.max_steps),
        loss_fn=task_loss(Task.LM),
    )


def _full_batch(micro_batches: Sequence[Batch]) -> Batch:
    return token_batch(torch.cat([b.inputs for b in micro_batches]), torch.cat([b.targets for b in micro_batches]))


# ----------------------------------------------------------------------------- C01


SCHEDULES: dict[str, dict[str, Any]] = {
    "constant-warmup": {"name": "constant", "warmup_steps": 3},
    "cosine-warmup": {"name": "cosine", "warmup_steps": 2, "min_lr_ratio": 0.1},
    "linear": {"name": "linear", "min_lr_ratio": 0.2},
    "step-warmup": {"name": "step", "warmup_steps": 1, "step_size": 2, "gamma": 0.5},
}
#: Two overflows in a row at the very first steps, then one more after an applied step.
C01_OVERFLOWS = [1, 2, 4]
C01_STEPS = 6


def _check_skips_hold_everything(spec: JobSpec, run_dir: Path, ctx: DistContext, overflows: Sequence[int]) -> None:
    """Run ``spec``; every overflow step leaves model, optimizer state (moments, step counters, momentum)
    and the LR schedule bit-identical; the schedule advances exactly once per applied step."""
    fresh = build_components(spec, ctx)
    states: dict[int, Mapping[str, Any]] = {
        0: {
            "model": fresh.model.state_dict(),
            "optimizer": fresh.optimizer.state_dict(),
            "lr_scheduler": fresh.lr_scheduler.state_dict(),
        }
    }
    multiplier, base_lr = fresh.lr_scheduler.multiplier, spec.optimizer.lr
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(spec, run_dir, ctx)
    assert not [w for w in caught if "lr_scheduler.step()" in str(w.message)]

    numbers = range(1, spec.max_steps + 1)
    steps = _steps(run_dir)
    assert [s["overflow"] for s in steps] == [n in overflows for n in numbers]
    assert [s["skipped_steps"] for s in steps] == [len([t for t in overflows if t <= n]) for n in numbers]
    applied_before = [len([t for t in range(1, n) if t not in overflows]) for n in numbers]
    assert [s["lr"] for s in steps] == pytest.approx([base_lr * multiplier(n) for n in applied_before], rel=1e-12)
    keys = ("model", "optimizer", "lr_scheduler")
    for step in numbers:
        states[step] = load_checkpoint(step_path(run_dir, step))
        now, before = ({k: states[n][k] for k in keys} for n in (step, step - 1))
        if step in overflows:
            assert_bit_identical(now, before, f"step {step}")
        else:
            assert not all(torch.equal(now["model"][k], before["model"][k]) for k in now["model"])
    applied = spec.max_steps - len(overflows)
    final = load_checkpoint(final_path(run_dir))
    assert final["lr_scheduler"]["last_epoch"] == applied
    assert final["lr_scheduler"]["_last_lr"] == pytest.approx([base_lr * multiplier(applied)], rel=1e-12)
    for state in final["optimizer"]["state"].values():
        if "step" in state:  # AdamW's per-parameter step counter counts applied steps only
            assert float(state["step"]) == applied


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(("name", "implementation"), PATHS)
def test_skips_hold_every_schedule_and_optimizer_path(
    schedule: str, name: str, implementation: str, cpu_ctx: DistContext, tmp_path: Path, tiny_mlp_spec: SpecFactory
) -> None:
    """C01 variant: every LR schedule (with and without warm-up) x every optimizer path, K=2, fp16,
    +inf on steps 1 and 2 (two in a row, at the first step) and 4.

    The schedule advances exactly once per applied step (lr of each step = base x m(applied so far));
    each skipped step leaves weights, optimizer state (moments, step counters, momentum buffers) and
    schedule bit-identical; the scale halves on each overflow.
    """
    spec = tiny_mlp_spec(
        precision="fp16",
        loss_scale={"init_scale": 1024.0},
        gradient_accumulation_steps=2,
        micro_batch_size=8,
        max_steps=C01_STEPS,
        optimizer=_optimizer(name, implementation),
        lr_scheduler=SCHEDULES[schedule],
        checkpoint_interval=1,
        faults={"nonfinite_grad_steps": C01_OVERFLOWS, "nonfinite_value": "inf"},
    )
    _check_skips_hold_everything(spec, tmp_path, cpu_ctx, C01_OVERFLOWS)
    assert [s["loss_scale"] for s in _steps(tmp_path)] == [1024.0, 512.0, 256.0, 256.0, 128.0, 128.0]


@pytest.mark.parametrize(("precision", "value"), [("bf16", "nan"), ("fp32", "inf"), ("fp16", "nan")])
def test_skips_hold_the_schedule_in_every_precision(
    precision: str, value: str, cpu_ctx: DistContext, tmp_path: Path, tiny_mlp_spec: SpecFactory
) -> None:
    """C01 variant: a non-finite gradient in bf16 / fp32 (no loss scaler) or a NaN in fp16 is skipped the
    same way: warm-up cosine schedule held, AdamW (fused) state bit-identical, K=3."""
    spec = tiny_mlp_spec(
        precision=precision,
        gradient_accumulation_steps=3,
        micro_batch_size=4,
        max_steps=C01_STEPS,
        optimizer=_optimizer("adamw", "fused"),
        lr_scheduler=SCHEDULES["cosine-warmup"],
        checkpoint_interval=1,
        faults={"nonfinite_grad_steps": C01_OVERFLOWS, "nonfinite_value": value},
    )
    _check_skips_hold_everything(spec, tmp_path, cpu_ctx, C01_OVERFLOWS)


# ----------------------------------------------------------------------------- C03


def test_custom_max_scale_with_growth_interval_one(
    cpu_ctx: DistContext, tmp_path: Path, tiny_mlp_spec: SpecFactory
) -> None:
    """C03 variant: ``max_scale`` 3000 (not a power of two), growth interval 1, a whole job: the scale
    grows every clean step, is clamped at exactly 3000 and never exceeds it; no step is skipped."""
    spec = tiny_mlp_spec(
        precision="fp16", loss_scale={"init_scale": 256.0, "growth_interval": 1, "max_scale": 3000.0}, max_steps=8
    )
    train(spec, tmp_path, cpu_ctx)
    steps = _steps(tmp_path)
    assert [s["loss_scale"] for s in steps] == [256.0, 512.0, 1024.0, 2048.0, 3000.0, 3000.0, 3000.0, 3000.0]
    assert not any(s["overflow"] for s in steps)


def _float32_at_most(value: float) -> float:
    """The largest float32 not above ``value``."""
    rounded = torch.tensor(value, dtype=torch.float32)
    if rounded.item() > value:
        rounded = torch.nextafter(rounded, torch.tensor(-math.inf))
    return rounded.item()


@pytest.mark.parametrize("max_scale", [16777219.0, 3.0e9 + 1.0, 2.0**64, 1.0000001])
def test_scale_never_exceeds_a_max_scale_float32_cannot_hold(max_scale: float) -> None:
    """C03 variant: the scale lives in float32; a ``max_scale`` float32 cannot represent (2**24 + 3 rounds
    *up* to 2**24 + 4) must still bound it, also when ``init_scale`` equals ``max_scale``. 300 clean
    steps at growth interval 1: always finite, never above ``max_scale``, and at the largest float32 below it."""
    spec = LossScaleSpec(init_scale=max_scale, max_scale=max_scale, min_scale=1.0, growth_interval=1)
    scaler = build_scaler(spec, CPU)
    scales = [scaler.scale.item()]
    for _ in range(300):
        scaler.update(torch.zeros(()))
        scales.append(scaler.scale.item())
    assert all(math.isfinite(s) and 0.0 < s <= max_scale for s in scales), (max(scales), max_scale)
    assert scales[-1] == _float32_at_most(max_scale)


@pytest.mark.parametrize("min_scale", [1.00000017, 3.0e-7, 1.0])
def test_scale_never_falls_below_a_min_scale_float32_cannot_hold(min_scale: float) -> None:
    """C03/C11 variant: a ``min_scale`` float32 cannot represent (1.00000017 rounds *down*) still bounds the
    scale from below after any number of backoffs, with growth factor 1024 and backoff factor 1e-3."""
    scaler = DynamicLossScaler(
        init_scale=2.0**20,
        growth_factor=1024.0,
        backoff_factor=1e-3,
        growth_interval=1,
        min_scale=min_scale,
        max_scale=2.0**64,
    )
    pattern = [True] * 40 + [False] * 30 + [True] * 40
    for overflow in pattern:
        scaler.update(torch.tensor(float(overflow)))
        value = scaler.scale.item()
        assert min_scale <= value <= 2.0**64 and math.isfinite(value)
    assert scaler.scale.item() == scaler.min_scale  # pinned at the (float32) bound after the last backoffs


def test_odd_bounds_are_rejected_or_deliberate() -> None:
    """C03 variant: contradictory bounds are rejected with an error naming the field; the rest is deliberate.

    Rejected: dynamic ``init_scale`` above ``max_scale`` or below ``min_scale``, ``min_scale`` above
    ``max_scale``, an infinite or non-positive bound, bounds between which no float32 scale exists.
    Deliberate: ``min_scale == max_scale`` pins the dynamic scale (overflows still skip, the scale never
    moves); a static scaler uses its scale as given (the bounds belong to the dynamic rule), even above
    ``max_scale``.
    """
    cases = [
        ({"init_scale": 2.0**25}, "init_scale"),
        ({"init_scale": 0.5}, "init_scale"),
        ({"min_scale": 4.0, "max_scale": 2.0, "init_scale": 3.0}, "min_scale"),
        ({"max_scale": math.inf}, "max_scale"),
        ({"min_scale": 0.0}, "min_scale"),
        # bounds that bracket no float32 (the scale's dtype): 2**24 + 3 lies between 2**24 + 2 and 2**24 + 4
        ({"min_scale": 16777219.0, "max_scale": 16777219.0, "init_scale": 16777219.0}, "max_scale"),
    ]
    for fields, field in cases:
        with pytest.raises(ValidationError) as info:
            LossScaleSpec.model_validate(fields)
        assert [e["loc"][-1] for e in info.value.errors()] == [field], fields
        assert field in str(info.value)
    with pytest.raises(ValueError, match="init_scale"):
        DynamicLossScaler(init_scale=2.0**25, max_scale=2.0**24)

    pinned = build_scaler(LossScaleSpec(init_scale=8.0, min_scale=8.0, max_scale=8.0, growth_interval=1), CPU)
    for overflow in [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]:
        pinned.update(torch.tensor(overflow))
        assert pinned.scale.item() == 8.0
    static = build_scaler(LossScaleSpec(mode="static", init_scale=2.0**30, max_scale=2.0**24), CPU)
    assert isinstance(static, StaticLossScaler) and static.scale.item() == 2.0**30


# ----------------------------------------------------------------------------- C05 / C06


LOSS_FACTOR = 100.0  # C06: a loss x100 makes the true gradient norm far above max_grad_norm
MAX_GRAD_NORM = 1.0
#: Relative error of the pre-clip norm and of the clipped gradients against fp32, per compute dtype.
CLIP_TOLERANCE = {"fp16": 1e-3, "bf16": 1e-2}


def _scaled_loss(parts: Components) -> Components:
    base = parts.loss_fn
    return dataclasses.replace(parts, loss_fn=lambda model, batch: LOSS_FACTOR * base(model, batch))


def _reference_clipped(
    reference: Components, weights: Mapping[str, Tensor], window: list[Batch], ctx: DistContext
) -> tuple[float, list[Tensor]]:
    """fp32 pre-clip norm of the window's gradient at ``weights``, and the clipped fp32 gradients."""
    reference.model.load_state_dict(weights)
    accumulate_window(reference.model, window, reference.precision, reference.loss_fn, ctx)
    grads = [grad_of(p).detach().clone() for p in reference.model.parameters()]
    reference.optimizer.zero_grad(set_to_none=True)
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item()
    return norm, [g * min(1.0, MAX_GRAD_NORM / (norm + 1e-6)) for g in grads]


def _record_optimizer_inputs(optimizer: torch.optim.Optimizer) -> list[list[Tensor]]:
    """Wrap the optimizer's step (Halfcast's direct ``apply_update``, the one the precision step calls) to keep a
    copy of the gradients it receives at every call."""
    received: list[list[Tensor]] = []
    name = "apply_update" if isinstance(optimizer, DeviceSkipOptimizer) else "step"
    original = getattr(optimizer, name)

    def step(*args: Any, **kwargs: Any) -> Any:
        received.append([p.grad.detach().clone() for group in optimizer.param_groups for p in group["params"]])
        return original(*args, **kwargs)

    setattr(optimizer, name, step)
    return received


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize(("name", "implementation"), PATHS)
def test_clip_once_on_the_unscaled_window_gradient(
    precision: str, name: str, implementation: str, cpu_ctx: DistContext, tiny_mlp_spec: SpecFactory
) -> None:
    """C05/C06 variant: K=3 accumulation, loss x100, max_grad_norm 1.0, fp16 (init scale 65536, so the
    first attempts overflow) and bf16, for every optimizer path.

    Each attempted step calls the optimizer once; skipped attempts leave the weights; the logged
    pre-clip norm equals the fp32 norm of the whole window; the optimizer receives the fp32 clipped
    gradients (norm 1.0, not scaled); SGD's update is the fp32 clipped update.
    """
    spec = tiny_mlp_spec(
        precision=precision,
        loss_scale={"init_scale": 65536.0} if precision == "fp16" else None,
        gradient_accumulation_steps=3,
        micro_batch_size=8,
        max_grad_norm=MAX_GRAD_NORM,
        optimizer=_optimizer(name, implementation, lr=0.01),
    )
    parts = _scaled_loss(build_components(spec, cpu_ctx))
    reference = _scaled_loss(build_components(tiny_mlp_spec(optimizer=_optimizer(name, "plain", lr=0.01)), cpu_ctx))
    received = _record_optimizer_inputs(parts.optimizer)
    stream = parts.dataset.train_batches(8, rank=0, world_size=1, seed=spec.seed)
    tolerance = CLIP_TOLERANCE[precision]
    attempts = 0
    for step in (1, 2):
        window = [next(stream) for _ in range(3)]
        weights = {k: v.clone() for k, v in parts.model.state_dict().items()}
        norm32, clipped32 = _reference_clipped(reference, weights, window, cpu_ctx)
        assert norm32 > 10 * MAX_GRAD_NORM  # clipping is active
        for _ in range(20):
            attempts += 1
            result = train_step(parts, window, step=step, max_grad_norm=MAX_GRAD_NORM, dist_ctx=cpu_ctx)
            outcome = result.outcome.to_host()
            assert len(received) == attempts  # one optimizer call per attempted step, never per micro-batch
            if outcome.applied:
                break
            assert_bit_identical(parts.model.state_dict(), weights, "skipped attempt")
        assert outcome.applied and outcome.grad_norm == pytest.approx(norm32, rel=tolerance)
        got = received[-1]
        got_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in got])).item()
        assert got_norm == pytest.approx(MAX_GRAD_NORM, rel=1e-4)
        for g, r in zip(got, clipped32, strict=True):
            torch.testing.assert_close(g, r, rtol=0, atol=tolerance * MAX_GRAD_NORM)
        if name == "sgd" and step == 1:  # first SGD step: update = -lr * (clipped grad + wd * weight)
            after = parts.model.state_dict().values()
            for before, updated, grad in zip(weights.values(), after, clipped32, strict=True):
                expected = before - 0.01 * (grad + 0.01 * before)
                torch.testing.assert_close(updated, expected, rtol=0, atol=0.01 * tolerance * MAX_GRAD_NORM + 1e-6)
    if precision == "bf16":
        assert attempts == 2  # no loss scale: nothing overflows


# ----------------------------------------------------------------------------- C08 (single rank)


def _c08_spec(precision: str, **overrides: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "model": {"name": "mlp", "config": {"hidden_sizes": [32], "dropout": 0.1}},
        "dataset": {"name": "synthetic", "config": {"in_features": 16, "num_samples": 96, "seed": 3}},
        "precision": precision,
        "optimizer": {"name": "adamw", "lr": 0.01, "weight_decay": 0.01},
        "lr_scheduler": {"name": "cosine", "warmup_steps": 3, "min_lr_ratio": 0.1},
        "micro_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "max_steps": 9,
        "checkpoint_interval": 1,
        "seed": 4,
    }
    if precision == "fp16":
        # growth interval 3, hysteresis 2: step 2 overflows without backoff (hysteresis 2 -> 1), steps 3-5
        # grow at 5, steps 6-7 overflow twice (backoff at 7): checkpoints 2, 4, 6 are all mid-interval.
        fields |= {
            "loss_scale": {"init_scale": 1024.0, "growth_interval": 3, "hysteresis": 2},
            "faults": {"nonfinite_grad_steps": [2, 6, 7], "nonfinite_value": "inf"},
        }
    else:
        fields |= {"faults": {"nonfinite_grad_steps": [3], "nonfinite_value": "nan"}}
    return JobSpec.model_validate(fields | overrides)


@pytest.fixture(scope="module")
def c08_whole(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Uninterrupted 9-step runs (a checkpoint after every step), per precision."""
    ctx = DistContext(rank=0, local_rank=0, world_size=1, device=CPU)
    runs = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for precision in ("fp16", "bf16"):
            run_dir = tmp_path_factory.mktemp("c08") / precision
            train(_c08_spec(precision), run_dir, ctx)
            runs[precision] = run_dir
    finally:
        torch.set_num_threads(threads)
    return runs


def _assert_resume_identical(whole: Path, resumed: Path, at: int) -> None:
    assert _numerics(_steps(resumed)) == _numerics([r for r in _steps(whole) if r["step"] > at])
    final_whole, final_resumed = load_checkpoint(final_path(whole)), load_checkpoint(final_path(resumed))
    for part in ("model", "optimizer", "lr_scheduler", "precision", "counters", "step"):
        assert_bit_identical(final_whole[part], final_resumed[part], part)


@pytest.mark.parametrize(
    ("precision", "at", "trackers"),
    [
        ("fp16", 2, (0, 1)),  # right after a skipped step that used up one unit of hysteresis
        ("fp16", 4, (2, 1)),  # growth tracker mid-interval (2 of 3), hysteresis tracker mid (1 of 2)
        ("fp16", 6, (0, 1)),  # after a skipped step, one overflow away from a backoff
        ("bf16", 3, None),  # bf16: right after a skipped (NaN) step
        ("bf16", 5, None),
    ],
)
def test_resume_mid_interval_is_bit_identical(
    precision: str,
    at: int,
    trackers: tuple[int, int] | None,
    c08_whole: dict[str, Path],
    cpu_ctx: DistContext,
    tmp_path: Path,
) -> None:
    """C08 variant: resume from checkpoints taken while the growth and hysteresis trackers are
    mid-interval and right after skipped steps, with AdamW, a warm-up cosine schedule, dropout and K=2,
    in fp16 and bf16: records and final state (model, optimizer, schedule, scaler, counters) are
    bit-identical to the uninterrupted run."""
    whole = c08_whole[precision]
    saved = load_checkpoint(step_path(whole, at))
    if trackers is not None:
        scaler = cast(DynamicScalerState, saved["precision"]["scaler"])  # trackers given: a dynamic scaler's run
        assert (scaler["growth_tracker"], scaler["hysteresis_tracker"]) == trackers
    assert saved["counters"]["consecutive_skips"] == int(_steps(whole)[at - 1]["overflow"])
    resumed = tmp_path / "resumed"
    train(_c08_spec(precision), resumed, cpu_ctx, resume_from=step_path(whole, at))
    _assert_resume_identical(whole, resumed, at)
    if precision == "fp16":
        assert [s["loss_scale"] for s in _steps(whole)] == [1024.0] * 5 + [2048.0, 2048.0, 1024.0, 1024.0]


# ----------------------------------------------------------------------------- C11


@pytest.mark.parametrize(
    ("value", "loss_scale", "accumulation", "reason", "floor"),
    [
        # only infinities, scale at min_scale: the guard's dedicated reason
        ("inf", {"init_scale": 65536.0}, 1, "loss_scale_collapsed", 1.0),
        ("inf", {"init_scale": 65536.0, "hysteresis": 3}, 2, "loss_scale_collapsed", 1.0),
        ("nan", {"init_scale": 65536.0, "hysteresis": 2, "min_scale": 2.0**-24}, 2, "nonfinite_gradients", 2.0**-24),
        (
            "inf",
            {"mode": "static", "init_scale": 1024.0},
            2,
            "nonfinite_gradients",
            1024.0,
        ),  # a static scale never moves
    ],
    ids=["inf", "inf-hysteresis3-K2", "nan-hysteresis2-min2e-24", "inf-static"],
)
def test_nonfinite_gradients_every_step_fail_long_before_the_end(
    value: str,
    loss_scale: dict[str, Any],
    accumulation: int,
    reason: str,
    floor: float,
    cpu_ctx: DistContext,
    tmp_path: Path,
    tiny_mlp_spec: SpecFactory,
) -> None:
    """C11 variant: +inf (or NaN) on every step, with hysteresis, accumulation, the smallest allowed
    ``min_scale`` or a static scale, 250 steps requested, default limits. The scale falls to its floor
    and stays there (never 0 or subnormal); the weights never change; the job fails with a typed reason
    after ``max_consecutive_skips`` (50) steps.

    Deliberate: with infinities only and a dynamic scale at ``min_scale`` the reason is
    ``loss_scale_collapsed`` (no smaller scale can help), otherwise ``nonfinite_gradients``.
    """
    spec = tiny_mlp_spec(
        precision="fp16",
        loss_scale=loss_scale,
        max_steps=250,
        gradient_accumulation_steps=accumulation,
        micro_batch_size=8,
        checkpoint_interval=10,
        faults={"nonfinite_grad_steps": list(range(1, 251)), "nonfinite_value": value},
    )
    initial = build_components(spec, cpu_ctx).model.state_dict()
    with pytest.raises(TrainerError) as info:
        train(spec, tmp_path, cpu_ctx)
    assert info.value.reason == reason
    steps = _steps(tmp_path)
    assert len(steps) == spec.max_consecutive_skips < 250 and all(s["overflow"] for s in steps)
    scales = [s["loss_scale"] for s in steps]
    assert min(scales) == scales[-1] == floor
    assert all(s >= floor and math.isfinite(s) for s in scales)
    assert floor >= torch.finfo(torch.float32).tiny  # a normal float32, far from 0 and the subnormals
    for step in range(10, len(steps), 10):
        weights = load_checkpoint(step_path(tmp_path, step))["model"]
        assert_bit_identical(weights, initial, f"step {step}")


def test_collapse_is_recognised_at_a_min_scale_float32_rounds_up(
    cpu_ctx: DistContext, tmp_path: Path, tiny_mlp_spec: SpecFactory
) -> None:
    """C11 variant: ``min_scale`` 1.0000001 is held as float32 1.00000012; +inf on every step still ends
    with ``loss_scale_collapsed`` (the scale did reach its floor), never below ``min_scale``."""
    spec = tiny_mlp_spec(
        precision="fp16",
        loss_scale={"init_scale": 4.0, "min_scale": 1.0000001},
        max_steps=100,
        max_consecutive_skips=6,
        faults={"nonfinite_grad_steps": list(range(1, 101)), "nonfinite_value": "inf"},
    )
    with pytest.raises(TrainerError) as info:
        train(spec, tmp_path, cpu_ctx)
    assert info.value.reason == "loss_scale_collapsed", info.value.message
    scales = [s["loss_scale"] for s in _steps(tmp_path)]
    assert scales[:2] == [4.0, 2.0] and all(s >= 1.0000001 for s in scales)


@pytest.mark.parametrize(("precision", "value"), [("fp32", "inf"), ("bf16", "nan"), ("fp16", "inf"), ("fp16", "nan")])
def test_nonfinite_loss_every_step_fails_with_nonfinite_loss(
    precision: str, value: str, cpu_ctx: DistContext, tmp_path: Path, tiny_mlp_spec: SpecFactory
) -> None:
    """C11 variant: the loss itself is +inf or NaN on every step (not only the gradients), in every
    precision: the job fails with ``nonfinite_loss`` after ``max_consecutive_nonfinite_losses`` (10) of
    250 steps; every step is skipped and the weights stay finite and unchanged."""
    spec = tiny_mlp_spec(precision=precision, max_steps=250, gradient_accumulation_steps=2, micro_batch_size=8)
    poison = float(value)

    def nonfinite(loss: Tensor) -> Tensor:
        return loss * poison  # as a non-finite activation would: the gradients are non-finite too

    with captured_components() as built:
        original = loop.build_components

        def poisoned(spec: JobSpec, dist_ctx: DistContext, **options: Any) -> Components:
            parts = original(spec, dist_ctx, **options)
            base = parts.loss_fn
            return dataclasses.replace(parts, loss_fn=lambda model, batch: nonfinite(base(model, batch)))

        with pytest.MonkeyPatch.context() as patch, pytest.raises(TrainerError) as info:
            patch.setattr(loop, "build_components", poisoned)
            train(spec, tmp_path, cpu_ctx)
    assert info.value.reason == "nonfinite_loss"
    steps = _steps(tmp_path)
    assert len(steps) == spec.max_consecutive_nonfinite_losses
    assert all(s["loss"] is None and s["overflow"] and s["grad_norm"] is None for s in steps)
    initial = build_components(spec, cpu_ctx).model.state_dict()
    assert_bit_identical(built[0].model.state_dict(), initial, "weights")


# ----------------------------------------------------------------------------- C15


def _accumulate_scalar(precision: str, init_scale: float | None, micro_batches: int = 64) -> Tensor:
    """C15's scalar: micro-batch 0 gives the weight a gradient of 1.0, each of the next K one of 1e-3;
    returns the unscaled accumulated gradient the optimizer sees (float32)."""
    fields: dict[str, Any] = {"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "precision": precision}
    if init_scale is not None:
        fields["loss_scale"] = {"init_scale": init_scale}
    policy = build_precision(JobSpec.model_validate(fields), CPU)
    layer = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(0.5)
    for x in [torch.ones(1, 1)] + [torch.full((1, 1), 1e-3)] * micro_batches:
        with policy.autocast():
            out = layer(x)
        policy.backward(out.float().sum())
    assert grad_of(layer.weight).dtype == torch.float32
    optimizer = build_optimizer(OptimizerSpec(name="sgd", lr=1.0), layer.parameters())
    received = _record_optimizer_inputs(optimizer)
    outcome = policy.step(optimizer, list(layer.parameters()), None).to_host()
    assert outcome.applied
    return received[0][0]


@pytest.mark.parametrize(("precision", "init_scale"), [("fp16", 1024.0), ("fp16", 1.0), ("bf16", None)])
def test_fp16_and_bf16_accumulate_in_fp32(precision: str, init_scale: float | None) -> None:
    """C15 variant: fp16 (loss scale 1024 and 1) accumulates like bf16, in the fp32 master gradient:
    1.0 + 64 x 1e-3 = 1.064 +- 1e-4 after unscaling (an fp16 or bf16 buffer would stay near 1.0)."""
    grad = _accumulate_scalar(precision, init_scale)
    assert abs(grad.item() - 1.064) < 1e-4


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_k64_window_gradient_is_the_fp32_sum_of_micro_batch_gradients(
    precision: str, cpu_ctx: DistContext, tiny_mlp_spec: SpecFactory
) -> None:
    """C15 variant: a K=64 window of single-sample micro-batches on the tiny MLP. The accumulated
    gradient is float32 and equals the float64 sum of the 64 per-micro-batch low-precision gradients
    (so no rounding to the compute dtype between micro-batches), and matches the fp32 full batch."""
    spec = tiny_mlp_spec(precision=precision, loss_scale={"init_scale": 256.0} if precision == "fp16" else None)
    parts = build_components(spec, cpu_ctx)
    stream = parts.dataset.train_batches(1, rank=0, world_size=1, seed=0)
    window = [next(stream) for _ in range(64)]
    accumulate_window(parts.model, window, parts.precision, parts.loss_fn, cpu_ctx)
    assert all(grad_of(p).dtype == torch.float32 for p in parts.model.parameters())
    scale = parts.precision.loss_scale
    window_grads = [grad_of(p).double() / scale for p in parts.model.parameters()]
    parts.optimizer.zero_grad(set_to_none=True)

    total = [torch.zeros_like(g) for g in window_grads]
    for batch in window:
        accumulate_window(parts.model, [batch], parts.precision, parts.loss_fn, cpu_ctx)
        for t, p in zip(total, parts.model.parameters(), strict=True):
            t += grad_of(p).double() / scale / 64  # each micro-batch alone is normalised by 1, in the window by 64
        parts.optimizer.zero_grad(set_to_none=True)
    for got, expected in zip(window_grads, total, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)

    full = feature_batch(torch.cat([b.inputs for b in window]), torch.cat([b.targets for b in window]))
    reference = torch.autograd.grad(parts.loss_fn(parts.model, full) / 64, list(parts.model.parameters()))
    for got, ref in zip(window_grads, reference, strict=True):
        torch.testing.assert_close(got.float(), ref, rtol=0, atol=2e-2 * ref.abs().max().item() + 1e-6)


def test_k64_bf16_job_step_matches_fp32(cpu_ctx: DistContext, tmp_path: Path, tiny_mlp_spec: SpecFactory) -> None:
    """C15 variant: a whole bf16 job step with K=64 micro-batches of 2 gives the fp32 job's loss and
    gradient norm (within bf16 compute rounding, far below what a bf16 accumulator would lose)."""
    results = {}
    for precision in ("fp32", "bf16"):
        spec = tiny_mlp_spec(
            precision=precision,
            gradient_accumulation_steps=64,
            micro_batch_size=2,
            max_steps=1,
            optimizer={"name": "sgd", "lr": 0.1},
        )
        train(spec, tmp_path / precision, cpu_ctx)
        results[precision] = _steps(tmp_path / precision)[0]
    assert results["bf16"]["grad_norm"] == pytest.approx(results["fp32"]["grad_norm"], rel=5e-3)
    assert results["bf16"]["loss"] == pytest.approx(results["fp32"]["loss"], rel=5e-3)


# ----------------------------------------------------------------------------- C17 (single rank)


@pytest.mark.parametrize("valid", [(0, 7, 3), (5, 0), (0, 0, 9, 0)])
def test_zero_token_micro_batches_in_a_window(valid: tuple[int, ...], cpu_ctx: DistContext) -> None:
    """C17 variant: micro-batches with zero valid tokens inside a window contribute nothing; the window
    gradient equals the full-batch gradient over the valid tokens (1e-6) and the logged loss is their mean."""
    parts = _lm_parts("fp32", cpu_ctx)
    micro = [lm_micro_batch(v, seed=10 + i) for i, v in enumerate(valid)]
    stats = accumulate_window(parts.model, micro, parts.precision, parts.loss_fn, cpu_ctx)
    got = [grad_of(p).clone() for p in parts.model.parameters()]
    full = _full_batch(micro)
    assert int(stats.num_elements) == full.num_elements == sum(valid)
    ref_loss = parts.loss_fn(parts.model, full) / sum(valid)
    for g, r in zip(got, torch.autograd.grad(ref_loss, list(parts.model.parameters())), strict=True):
        torch.testing.assert_close(g, r, atol=1e-6, rtol=0)
    assert float(stats.loss) == pytest.approx(ref_loss.item(), abs=1e-6)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_window_without_valid_tokens_is_no_update(precision: str, cpu_ctx: DistContext) -> None:
    """C17 variant: a whole window (K=2) with zero valid tokens, after a real step (so AdamW's moments are
    non-zero): no NaN anywhere, and no update: weights, optimizer state (moments, step counters), LR
    schedule and loss-scaler state stay bit-identical; it is not an overflow and not a skipped step."""
    parts = _lm_parts(precision, cpu_ctx)

    def step(number: int, valid: tuple[int, int]) -> StepResult:
        window = [lm_micro_batch(v, seed=2 * number + i) for i, v in enumerate(valid)]
        return train_step(parts, window, step=number, max_grad_norm=1.0, dist_ctx=cpu_ctx)

    step(1, (9, 4))
    before = _snapshot(parts)
    result = step(2, (0, 0))
    outcome = result.outcome.to_host()
    assert math.isfinite(float(result.window.loss)) and int(result.window.num_elements) == 0
    assert not outcome.overflow and outcome.skipped_steps == 0 and outcome.grad_norm == 0.0
    assert not outcome.applied and int(parts.precision.empty_windows) == 1  # issue 25 item 7: it read applied
    assert all(torch.isfinite(p).all() for p in parts.model.parameters())
    assert_bit_identical(_snapshot(parts), before, "empty window")
    assert parts.precision.state_dict()["empty_windows"] == 1  # checkpoints carry the count
    step(3, (6, 2))  # the next real window is the schedule's second applied step
    assert parts.lr_scheduler.last_epoch == 2


# ----------------------------------------------------------------------------- two ranks (C08, C09, C17)

TWO_RANKS = 2
#: C09 runs: (parallelism, optimizer, implementation, injected value); fused SGD cannot step FSDP2 shards
#: (the spec rejects it), every other path runs under both.
C09_RUNS = [("ddp", n, i, "inf" if k % 2 else "nan") for k, (n, i) in enumerate(PATHS)] + [
    ("fsdp", n, i, "nan" if k % 2 else "inf") for k, (n, i) in enumerate(PATHS) if (n, i) != ("sgd", "fused")
]
C09_OVERFLOWS = [1, 3]
#: C17 windows per rank: (valid tokens, seed) per micro-batch.
C17_WINDOWS: dict[str, dict[int, list[tuple[int, int]]]] = {
    "uneven": {0: [(12, 21), (0, 22)], 1: [(1, 23), (5, 24)]},  # uneven ranks, a zero-token micro-batch
    "one_rank_empty": {0: [(4, 25), (9, 26)], 1: [(0, 27), (0, 28)]},  # rank 1's whole window is padding
}


def _c09_spec(parallelism: str, name: str, implementation: str, value: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "model": {"name": "mlp", "config": {"hidden_sizes": [16]}},
            "dataset": {"name": "synthetic", "config": {"in_features": 8, "num_samples": 128, "seed": 5}},
            "precision": "fp16",
            "loss_scale": {"init_scale": 1024.0},
            "processes": TWO_RANKS,
            "parallelism": parallelism,
            "micro_batch_size": 4,
            "gradient_accumulation_steps": 2,
            "max_steps": 4,
            "max_grad_norm": 1.0,
            "optimizer": _optimizer(name, implementation, lr=0.01),
            "lr_scheduler": {"name": "linear", "warmup_steps": 1},
            "faults": {"nonfinite_grad_steps": C09_OVERFLOWS, "nonfinite_value": value, "ranks": [1]},
        }
    )


def _c08_two_rank_spec() -> JobSpec:
    return _c08_spec(
        "fp16",
        processes=TWO_RANKS,
        micro_batch_size=4,
        max_steps=7,
        faults={"nonfinite_grad_steps": [2, 6], "nonfinite_value": "nan", "ranks": [1]},
    )


def _run_job(spec: JobSpec, run_dir: Path, ctx: DistContext, resume_from: Path | None = None) -> dict[str, Any]:
    """Train; this rank's final parameters, scaler state, skipped steps, and rank 0's step records."""
    with captured_components() as built:
        train(spec, run_dir, ctx, resume_from=resume_from)
    parts = built[-1]
    return {
        "params": _full_params(parts.model),
        "precision": parts.precision.state_dict(),
        "lr": float(parts.optimizer.param_groups[0]["lr"]),
        "steps": _numerics(_steps(run_dir)) if ctx.is_main else None,
    }


def _c09_scenario(ctx: DistContext, out: Path) -> dict[str, Any]:
    return {f"{p}-{n}-{i}-{v}": _run_job(_c09_spec(p, n, i, v), out / f"{p}-{n}-{i}", ctx) for p, n, i, v in C09_RUNS}


def _c08_scenario(ctx: DistContext, out: Path) -> dict[str, Any]:
    spec = _c08_two_rank_spec()
    runs = {"whole": _run_job(spec, out / "whole", ctx)}
    for at in (2, 4):
        runs[f"resumed-{at}"] = _run_job(spec, out / f"resumed-{at}", ctx, resume_from=step_path(out / "whole", at))
    return runs


def _c17_scenario(ctx: DistContext, out: Path) -> dict[str, Any]:
    parts = _lm_parts("fp32", ctx)
    results: dict[str, Any] = {}
    for name, per_rank in C17_WINDOWS.items():
        micro = [lm_micro_batch(valid, seed=seed) for valid, seed in per_rank[ctx.rank]]
        stats = accumulate_window(parts.train_model, micro, parts.precision, parts.loss_fn, ctx)
        results[name] = {
            "loss": float(stats.loss),
            "elements": int(stats.num_elements),
            "grads": [grad_of(p).detach().clone() for p in parts.model.parameters()],
        }
        parts.optimizer.zero_grad(set_to_none=True)
    dist.barrier()
    del parts  # drop DDP's reducer while the process group is alive
    parts = _lm_parts("fp16", ctx, loss_scale={"init_scale": 1024.0})
    train_step(
        parts,
        [lm_micro_batch(9, seed=31 + ctx.rank), lm_micro_batch(3, seed=33 + ctx.rank)],
        step=1,
        max_grad_norm=1.0,
        dist_ctx=ctx,
    )
    before = _snapshot(parts)
    empty = train_step(
        parts, [lm_micro_batch(0, seed=35), lm_micro_batch(0, seed=36)], step=2, max_grad_norm=1.0, dist_ctx=ctx
    )
    outcome = empty.outcome.to_host()
    results["empty"] = {
        "loss": float(empty.window.loss),
        "overflow": outcome.overflow,
        "before": before,
        "after": _snapshot(parts),
    }
    dist.barrier()
    del parts  # drop DDP's reducer while the process group is alive
    return results


def _c17_fsdp_scenario(ctx: DistContext, out: Path) -> dict[str, Any]:
    model = wrap_model(tiny_lm(), ctx, "fsdp", "fp32")
    precision = build_precision(JobSpec.model_validate({"model": {"name": "gpt"}, "dataset": {"name": "text"}}), CPU)
    results: dict[str, Any] = {}
    for name, per_rank in C17_WINDOWS.items():
        micro = [lm_micro_batch(valid, seed=seed) for valid, seed in per_rank[ctx.rank]]
        stats = accumulate_window(model, micro, precision, task_loss(Task.LM), ctx)
        grads = [_gathered(grad_of(p)) for p in model.parameters()]
        results[name] = {"loss": float(stats.loss), "elements": int(stats.num_elements), "grads": grads}
        model.zero_grad(set_to_none=True)
    return results


def _gathered(tensor: torch.Tensor) -> torch.Tensor:
    """The whole of a sharded (DTensor) tensor, gathered from every rank."""
    assert isinstance(tensor, DTensor), type(tensor)
    return tensor.full_tensor()


def _c15_scenario(ctx: DistContext, out: Path) -> dict[str, Any]:
    """C15's scalar under DDP and FSDP2 (bf16): gradient 1.0, then 64 micro-batches adding 1e-3 each."""
    policy = build_precision(
        JobSpec.model_validate({"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "precision": "bf16"}), CPU
    )
    results: dict[str, Any] = {}
    for parallelism in ("ddp", "fsdp"):
        layer = nn.Linear(1, 2, bias=False)  # two rows: one per rank under FSDP2
        with torch.no_grad():
            layer.weight.fill_(0.5)
        model = wrap_model(layer, ctx, parallelism, "bf16")
        inputs = [torch.ones(1, 1)] + [torch.full((1, 1), 1e-3)] * 64
        for index, x in enumerate(inputs):
            with grad_sync(model, sync=index == len(inputs) - 1):
                with policy.autocast():
                    out_ = model(x)
                policy.backward(out_.float().sum())
        grad = grad_of(unwrap_model(model).get_parameter("weight"))
        results[parallelism] = {
            "grad": grad.full_tensor() if isinstance(grad, DTensor) else grad.detach().clone(),
            "dtype": str((grad.to_local() if isinstance(grad, DTensor) else grad).dtype),
        }
        dist.barrier()
        del model, layer
    return results


TWO_RANK_SCENARIOS: dict[str, Callable[[DistContext, Path], dict[str, Any]]] = {
    "c09": _c09_scenario,
    "c08": _c08_scenario,
    "c17": _c17_scenario,
    "c17_fsdp": _c17_fsdp_scenario,
    "c15": _c15_scenario,
}


def _two_rank_worker(ctx: DistContext, out_dir: str) -> None:
    rank = ctx.rank
    results: dict[str, Any] = {}
    for name, scenario in TWO_RANK_SCENARIOS.items():
        try:
            results[name] = scenario(ctx, Path(out_dir) / name)
        except Exception as exc:
            log.exception("scenario %s failed on rank %d", name, rank)
            results[name] = f"{type(exc).__name__}: {exc}"
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Per rank, the results of every two-rank scenario (one gloo spawn for all of them)."""
    out = tmp_path_factory.mktemp("two_ranks")
    spawn_ranks(_two_rank_worker, str(out), world_size=TWO_RANKS)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(TWO_RANKS)]


def _scenario(runs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    results = [rank[name] for rank in runs]
    for result in results:
        assert not isinstance(result, str), result
    return results


@pytest.mark.slow
@pytest.mark.parametrize("run", [f"{p}-{n}-{i}-{v}" for p, n, i, v in C09_RUNS])
def test_fault_on_rank_1_skips_on_both_ranks(run: str, two_rank_runs: list[dict[str, Any]]) -> None:
    """C09 variant: +inf or NaN on rank 1 only (after the gradient all-reduce / in rank 1's FSDP2 shard),
    at steps 1 and 3 of a K=2 fp16 job, for every optimizer path under DDP and FSDP2: both ranks skip
    both steps, both scales end at 256, the parameters stay bit-identical across ranks."""
    ranks = [result[run] for result in _scenario(two_rank_runs, "c09")]
    steps = ranks[0]["steps"]
    assert [s["overflow"] for s in steps] == [True, False, True, False]
    assert [s["loss_scale"] for s in steps] == [1024.0, 512.0, 512.0, 256.0]
    assert steps[0]["overflow_ranks"] == [1]
    for rank in ranks:
        assert rank["precision"]["scaler"]["scale"] == 256.0 and rank["precision"]["skipped_steps"] == 2
    assert ranks[0]["lr"] == ranks[1]["lr"]
    for a, b in zip(ranks[0]["params"], ranks[1]["params"], strict=True):
        assert torch.equal(a, b) and torch.isfinite(a).all()


@pytest.mark.slow
@pytest.mark.parametrize("at", [2, 4])
def test_two_rank_resume_is_bit_identical(at: int, two_rank_runs: list[dict[str, Any]]) -> None:
    """C08 variant: 2 gloo ranks (DDP), fp16 with hysteresis 2 and growth interval 3, dropout, AdamW with
    warm-up cosine, NaN on rank 1 at steps 2 and 6; resumed from step 2 (after the skip) and step 4
    (trackers mid-interval): every rank's parameters and scaler state, and the records, equal the
    uninterrupted run's bit for bit."""
    ranks = _scenario(two_rank_runs, "c08")
    assert ranks[0][f"resumed-{at}"]["steps"] == [s for s in ranks[0]["whole"]["steps"] if s["step"] > at]
    for rank in ranks:
        whole, resumed = rank["whole"], rank[f"resumed-{at}"]
        assert_bit_identical(whole["params"], resumed["params"], "params")
        assert whole["precision"] == resumed["precision"]
    assert_bit_identical(ranks[0]["whole"]["params"], ranks[1]["whole"]["params"], "ranks")


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
@pytest.mark.parametrize("window", list(C17_WINDOWS))
def test_two_ranks_with_uneven_and_empty_token_counts(
    window: str, parallelism: str, two_rank_runs: list[dict[str, Any]]
) -> None:
    """C17 variant: 2 gloo ranks (DDP and FSDP2) with uneven valid-token counts, a zero-token micro-batch,
    and a rank whose whole window is padding: both ranks hold the full-batch gradient normalised by the
    global count (1e-6), and log the full-batch mean loss."""
    ranks = _scenario(two_rank_runs, "c17" if parallelism == "ddp" else "c17_fsdp")
    micro = [lm_micro_batch(v, seed=s) for r in range(TWO_RANKS) for v, s in C17_WINDOWS[window][r]]
    full = _full_batch(micro)
    model = tiny_lm()
    ref_loss = task_loss(Task.LM)(model, full) / full.num_elements
    reference = torch.autograd.grad(ref_loss, list(model.parameters()))
    for rank in ranks:
        result = rank[window]
        assert result["elements"] == full.num_elements
        assert result["loss"] == pytest.approx(ref_loss.item(), abs=1e-6)
        for got, ref in zip(result["grads"], reference, strict=True):
            torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_two_ranks_window_without_valid_tokens_is_no_update(two_rank_runs: list[dict[str, Any]]) -> None:
    """C17 variant: on 2 ranks (fp16) a window with zero valid tokens everywhere, after a real step: no NaN, no
    overflow, and on both ranks weights, AdamW state, schedule and scaler stay bit-identical."""
    ranks = _scenario(two_rank_runs, "c17")
    for rank in ranks:
        empty = rank["empty"]
        assert math.isfinite(empty["loss"]) and not empty["overflow"]
        assert_bit_identical(empty["after"], empty["before"], "empty window")
    assert_bit_identical(ranks[0]["empty"]["after"]["model"], ranks[1]["empty"]["after"]["model"], "ranks")


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_two_ranks_accumulate_in_fp32(parallelism: str, two_rank_runs: list[dict[str, Any]]) -> None:
    """C15 variant: bf16 accumulation over 1 + 64 micro-batches on 2 gloo ranks, with DDP's ``no_sync`` and
    FSDP2's ``set_requires_gradient_sync(False)`` (which keeps the unsharded gradient itself): the
    accumulated gradient is float32 and 1.064 +- 1e-4 on both ranks (a bf16 buffer would stay at 1.0)."""
    for rank in _scenario(two_rank_runs, "c15"):
        result = rank[parallelism]
        assert result["dtype"] == "torch.float32"
        assert (result["grad"] - 1.064).abs().max().item() < 1e-4, result["grad"]
