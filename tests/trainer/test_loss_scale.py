"""Loss scalers: growth, backoff, hysteresis, bounds, state round-trip, GradScaler parity, no host sync."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from trainer_support import grad_of

from trainer.numerics.loss_scale import DynamicLossScaler, NoOpLossScaler, StaticLossScaler

INF = torch.tensor(1.0)
CLEAN = torch.tensor(0.0)


def _run(scaler: DynamicLossScaler, pattern: list[bool]) -> list[float]:
    """Scale after each step of an overflow pattern (True = overflow)."""
    scales = []
    for overflow in pattern:
        scaler.update(INF if overflow else CLEAN)
        scales.append(scaler.scale.item())
    return scales


def test_grows_after_growth_interval_clean_steps() -> None:
    scaler = DynamicLossScaler(init_scale=8.0, growth_interval=3, max_scale=2.0**20)
    assert _run(scaler, [False] * 7) == [8.0, 8.0, 16.0, 16.0, 16.0, 32.0, 32.0]


def test_backs_off_on_every_overflow_and_resets_growth_tracker() -> None:
    scaler = DynamicLossScaler(init_scale=1024.0, growth_interval=2, backoff_factor=0.25)
    assert _run(scaler, [True, False, True, False, False]) == [256.0, 256.0, 64.0, 64.0, 128.0]


def test_hysteresis_tolerates_overflows_until_tracker_runs_out_then_growth_refills() -> None:
    scaler = DynamicLossScaler(init_scale=1024.0, growth_interval=2, hysteresis=3)
    # Two overflows are tolerated, the third backs off; with the tracker empty the next
    # overflow backs off at once, until a growth refills it.
    scales = _run(scaler, [True, True, True, True, False, False, True, True])
    assert scales == [1024.0, 1024.0, 512.0, 256.0, 256.0, 512.0, 512.0, 512.0]
    assert int(scaler.hysteresis_tracker.item()) == 1


def test_hysteresis_is_not_refilled_by_a_clean_step_unless_consecutive() -> None:
    pattern = [True, False, True]
    plain = DynamicLossScaler(init_scale=64.0, growth_interval=100, hysteresis=2)
    consecutive = DynamicLossScaler(init_scale=64.0, growth_interval=100, hysteresis=2, consecutive_hysteresis=True)
    assert _run(plain, pattern) == [64.0, 64.0, 32.0]
    assert _run(consecutive, pattern) == [64.0, 64.0, 64.0]


def test_scale_is_clamped_to_min_scale_never_zero_or_subnormal() -> None:
    """Field case C11 at the scaler: NaN on every step never drives the scale below min_scale."""
    scaler = DynamicLossScaler(init_scale=65536.0, min_scale=1.0)
    scales = _run(scaler, [True] * 250)
    assert min(scales) == 1.0
    assert all(s >= 1.0 and s == s and s != float("inf") for s in scales)


def test_scale_is_clamped_to_max_scale() -> None:
    """Field case C03 at the scaler: growth interval 1 for 300 clean steps stays at max_scale."""
    scaler = DynamicLossScaler(init_scale=2.0**16, growth_interval=1, max_scale=2.0**24)
    scales = _run(scaler, [False] * 300)
    assert max(scales) == 2.0**24 and scales[-1] == 2.0**24


def test_state_dict_round_trip_continues_identically() -> None:
    rng = random.Random(3)
    pattern = [rng.random() < 0.2 for _ in range(120)]
    reference = DynamicLossScaler(init_scale=1024.0, growth_interval=4, hysteresis=2)
    expected = _run(reference, pattern)

    first = DynamicLossScaler(init_scale=1024.0, growth_interval=4, hysteresis=2)
    head = _run(first, pattern[:57])
    state = first.state_dict()
    resumed = DynamicLossScaler(init_scale=1024.0, growth_interval=4, hysteresis=2)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    assert head + _run(resumed, pattern[57:]) == expected


def test_load_state_dict_rejects_foreign_or_unusable_state() -> None:
    scaler = DynamicLossScaler()
    with pytest.raises(ValueError, match="DynamicLossScaler"):
        scaler.load_state_dict(StaticLossScaler(8.0).state_dict())
    bad = scaler.state_dict() | {"scale": float("inf")}
    with pytest.raises(ValueError, match="not finite"):
        scaler.load_state_dict(bad)


def _grad_scaler_scales(
    pattern: list[bool], *, init_scale: float, growth_interval: int, growth_factor: float, backoff_factor: float
) -> list[float]:
    """torch.amp.GradScaler's scale after each step of ``pattern`` (True = an inf gradient)."""
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([param], lr=0.0)
    reference = torch.amp.GradScaler(
        "cpu",
        init_scale=init_scale,
        growth_interval=growth_interval,
        growth_factor=growth_factor,
        backoff_factor=backoff_factor,
    )
    theirs = []
    for overflow in pattern:
        optimizer.zero_grad()
        reference.scale(param.sum()).backward()
        if overflow:
            grad_of(param)[0] = float("inf")
        reference.step(optimizer)
        reference.update()
        theirs.append(reference.get_scale())
    return theirs


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("growth_factor", "backoff_factor"), [(2.0, 0.5), (1.1, 0.9), (1.5, 0.3), (4.0, 0.7)])
def test_trajectory_equals_torch_grad_scaler_with_hysteresis_one(
    seed: int, growth_factor: float, backoff_factor: float
) -> None:
    """Same overflow pattern, same growth/backoff: the same float32 scales as torch.amp.GradScaler, bit
    for bit, also with factors float32 cannot hold (GradScaler rounds ``scale * factor`` once)."""
    rng = random.Random(seed)
    pattern = [rng.random() < 0.15 for _ in range(300)]
    ours = DynamicLossScaler(
        init_scale=2.0**10,
        growth_interval=5,
        max_scale=2.0**120,
        min_scale=2.0**-120,
        growth_factor=growth_factor,
        backoff_factor=backoff_factor,
    )
    theirs = _grad_scaler_scales(
        pattern, init_scale=2.0**10, growth_interval=5, growth_factor=growth_factor, backoff_factor=backoff_factor
    )
    assert _run(ours, pattern) == theirs


def test_unscale_divides_and_flags_inf_and_nan() -> None:
    scaler = DynamicLossScaler(init_scale=4.0)
    grads = [torch.tensor([4.0, 8.0]), torch.tensor([2.0], dtype=torch.float16)]
    assert scaler.unscale_(grads).item() == 0.0
    assert grads[0].tolist() == [1.0, 2.0] and grads[1].tolist() == [0.5]
    for bad in (float("inf"), float("nan")):
        assert scaler.unscale_([torch.tensor([1.0, bad])]).item() == 1.0


def test_noop_scaler_leaves_gradients_and_their_check_to_the_step() -> None:
    """The no-op scaler touches nothing; the precision step's norms catch non-finite gradients (test_precision)."""
    grad = torch.tensor([1.0e-30, 3.0, -7.25])
    before = grad.clone()
    scaler = NoOpLossScaler()
    assert scaler.unscale_([grad]).item() == 0.0
    assert torch.equal(grad, before)
    loss = torch.tensor(2.5, dtype=torch.bfloat16)
    assert scaler.scale_loss(loss) is loss


def test_static_scaler_never_changes() -> None:
    scaler = StaticLossScaler(128.0)
    for flag in (INF, CLEAN, INF):
        scaler.update(flag)
    assert scaler.scale.item() == 128.0
    assert scaler.scale_loss(torch.tensor(0.5)).item() == 64.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"init_scale": 0.5, "min_scale": 1.0},
        {"max_scale": float("inf")},
        {"growth_factor": 1.0},
        {"backoff_factor": 1.0},
        {"growth_interval": 0},
        {"hysteresis": 0},
    ],
)
def test_rejects_bad_arguments(kwargs: dict[str, Any]) -> None:  # Any: each case one bad argument, by name
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        DynamicLossScaler(**kwargs)


class _ScalarReads(TorchDispatchMode):
    """Counts device-to-host scalar reads (``aten::_local_scalar_dense``, i.e. ``.item()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_unscale_and_update_make_no_host_sync() -> None:
    scaler = DynamicLossScaler(init_scale=1024.0, growth_interval=2, hysteresis=2)
    grads = [torch.randn(5), torch.randn(3, 2)]
    with _ScalarReads() as reads:
        for _ in range(5):
            found_inf = scaler.unscale_(grads)
            scaler.update(found_inf)
    assert reads.count == 0
