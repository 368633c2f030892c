"""Halfcast's device-skipping AdamW and SGD: bit-identical to PyTorch on applied steps,
bit-identical state on skipped steps, on all six paths (AdamW/SGD x plain/foreach/fused).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

import pytest
import torch
from torch import Tensor, nn

from halfcast.contracts.spec import JobSpec, LRSchedulerSpec
from trainer.numerics.precision import build_precision
from trainer.optim.build import build_lr_scheduler
from trainer.optim.skipping import SGD, AdamW, Implementation, fused_supported

CPU = torch.device("cpu")
SHAPES = [(32, 16), (32,), (4, 32), (4,), (7, 5, 3), (1000,)]
IMPLEMENTATIONS: tuple[Implementation, ...] = ("plain", "foreach", "fused")
ADAMW: dict[str, Any] = {"lr": 3e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
SGD_ARGS: dict[str, Any] = {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}
PATHS = [(name, impl) for name in ("adamw", "sgd") for impl in IMPLEMENTATIONS]


def _params() -> list[nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [nn.Parameter(torch.randn(shape, generator=g)) for shape in SHAPES]


def _grads(step: int) -> list[Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(shape, generator=g) * 10.0 ** (step % 3 - 1) for shape in SHAPES]


def _halfcast(name: str, implementation: Implementation, params: list[nn.Parameter]) -> AdamW | SGD:
    if name == "adamw":
        return AdamW(params, implementation=implementation, **ADAMW)
    return SGD(params, implementation=implementation, **SGD_ARGS)


def _torch_reference(name: str, implementation: Implementation, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    flags: dict[str, Any] = {"plain": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[
        implementation
    ]
    if name == "adamw":
        return torch.optim.AdamW(params, **ADAMW, **flags)
    return torch.optim.SGD(params, **SGD_ARGS, **flags)


def _bits(tensor: Tensor) -> Tensor:
    """The raw bits, so -0.0 != +0.0 and NaN payloads count."""
    return tensor.detach().contiguous().view(torch.int32 if tensor.element_size() == 4 else torch.int64)


def _snapshot(params: list[nn.Parameter], optimizer: torch.optim.Optimizer) -> dict[str, Tensor]:
    """Every parameter, every optimizer-state tensor (moments, buffers, step counters) and every lr."""
    out = {f"param{i}": _bits(p).clone() for i, p in enumerate(params)}
    for i, p in enumerate(params):
        for key, value in optimizer.state[p].items():
            out[f"state{i}.{key}"] = _bits(value).clone()
    for i, group in enumerate(optimizer.param_groups):
        out[f"lr{i}"] = _bits(torch.as_tensor(group["lr"])).clone()
    return out


def _assert_same(before: dict[str, Tensor], after: dict[str, Tensor]) -> None:
    assert before.keys() == after.keys()
    changed = [key for key in before if not torch.equal(before[key], after[key])]
    assert not changed, f"changed on a skipped step: {changed}"


def _set_grads(params: list[nn.Parameter], grads: list[Tensor]) -> None:
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad.clone()


def _step(optimizer: torch.optim.Optimizer, found_inf: float) -> None:
    # The AMP protocol: torch.optim's fused step reads these attributes when they are set (no declared type).
    optimizer.grad_scale = None  # type: ignore[attr-defined]  # the AMP protocol's attribute
    optimizer.found_inf = torch.tensor(found_inf)  # type: ignore[attr-defined]  # the AMP protocol's attribute
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale, optimizer.found_inf  # type: ignore[attr-defined]  # set above


@pytest.mark.parametrize(("name", "implementation"), PATHS)
def test_applied_steps_are_bit_identical_to_pytorch(name: str, implementation: Implementation) -> None:
    """20 steps with skips at 1, 5 and 6 (inf and NaN gradients) equal PyTorch's optimizer run on the 17 applied ones."""
    ours, theirs = _params(), _params()
    optimizer, reference = _halfcast(name, implementation, ours), _torch_reference(name, implementation, theirs)
    for step in range(1, 21):
        grads = _grads(step)
        if step in (1, 5, 6):
            grads[0].view(-1)[3] = float("inf")
            grads[1].view(-1)[0] = float("nan")
            _set_grads(ours, grads)
            _step(optimizer, 1.0)
            continue
        _set_grads(ours, grads)
        _set_grads(theirs, grads)
        _step(optimizer, 0.0)
        reference.step()
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(_bits(a), _bits(b)), f"parameters differ at step {step}"
        for a, b in zip(ours, theirs, strict=True):
            for key, value in reference.state[b].items():
                assert torch.equal(_bits(optimizer.state[a][key]), _bits(value)), f"state {key} differs at step {step}"


@pytest.mark.parametrize(("name", "implementation"), PATHS)
def test_the_direct_step_equals_the_amp_protocol_step_bit_for_bit(name: str, implementation: Implementation) -> None:
    """``apply_update(found_inf, applied)`` (what the precision step calls, without torch.optim's step
    wrapper; fused AdamW counts its steps by ``applied`` in one op) leaves every parameter, moment and step
    counter as ``step()`` with ``found_inf`` set does, over applied and skipped steps alike."""
    direct_params, amp_params = _params(), _params()
    direct, amp = _halfcast(name, implementation, direct_params), _halfcast(name, implementation, amp_params)
    for step in range(1, 9):
        grads, flag = _grads(step), 1.0 if step in (1, 4, 5) else 0.0
        _set_grads(direct_params, grads)
        _set_grads(amp_params, grads)
        found_inf = torch.tensor(flag)
        with torch.no_grad():
            direct.apply_update(found_inf, found_inf.logical_not())
        _step(amp, flag)
        assert _snapshot(direct_params, direct).keys() == _snapshot(amp_params, amp).keys()
        for key, value in _snapshot(direct_params, direct).items():
            assert torch.equal(value, _snapshot(amp_params, amp)[key]), f"{key} differs after step {step}"
        direct.clear_grads()
        assert all(p.grad is None for p in direct_params)


@pytest.mark.parametrize(("name", "implementation"), PATHS)
@pytest.mark.parametrize("skip_at", [1, 4])
def test_a_skipped_step_changes_no_bit_on_any_path(name: str, implementation: Implementation, skip_at: int) -> None:
    """Overflow at the first step and at a later one, through the precision policy and the device schedule:
    parameters, every optimizer-state tensor, step counters and the learning rate keep their bits, and the
    step is reported as skipped."""
    params = _params()
    optimizer = _halfcast(name, implementation, params)
    schedule = build_lr_scheduler(LRSchedulerSpec(name="cosine", warmup_steps=2), optimizer, total_steps=10)
    spec = JobSpec.model_validate({"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "precision": "fp16"})
    policy = build_precision(spec, CPU)
    for step in range(1, skip_at + 1):
        grads = _grads(step)
        if step == skip_at:
            grads[2].view(-1)[5] = float("inf") if skip_at == 1 else float("nan")
            before, applied_before = _snapshot(params, optimizer), int(schedule.applied)
        _set_grads(params, grads)
        outcome = policy.step(optimizer, params, max_grad_norm=1.0)
        schedule.step(outcome.applied)
        optimizer.zero_grad(set_to_none=True)
    host = outcome.to_host()
    assert host.overflow and not host.applied and host.grad_norm is None and host.skipped_steps == 1
    _assert_same(before, _snapshot(params, optimizer))
    assert int(schedule.applied) == applied_before == skip_at - 1


def test_fresh_state_is_identical_on_every_path() -> None:
    """Eager state: the six paths start from the same tensors (so a skipped first step leaves the same state)."""
    for name in ("adamw", "sgd"):
        snapshots = [_snapshot(p, _halfcast(name, impl, p)) for impl in IMPLEMENTATIONS for p in [_params()]]
        for other in snapshots[1:]:
            _assert_same(snapshots[0], other)


def test_fused_sgd_first_step_skipped_then_applied_matches_an_unskipped_run() -> None:
    """PyTorch's fused SGD keeps an uninitialised momentum buffer after a skipped first step; ours does not."""
    skipped, clean = _params(), _params()
    first, second = _halfcast("sgd", "fused", skipped), _halfcast("sgd", "fused", clean)
    bad = [g.clone() for g in _grads(1)]
    bad[0].view(-1)[0] = float("nan")
    _set_grads(skipped, bad)
    _step(first, 1.0)
    for step in (2, 3):
        _set_grads(skipped, _grads(step))
        _set_grads(clean, _grads(step))
        _step(first, 0.0)
        _step(second, 0.0)
    _assert_same(_snapshot(clean, second), _snapshot(skipped, first))


@pytest.mark.parametrize(("name", "implementation"), PATHS)
def test_state_dict_round_trip_keeps_device_state(name: str, implementation: Implementation) -> None:
    params = _params()
    optimizer = _halfcast(name, implementation, params)
    for step in (1, 2):
        _set_grads(params, _grads(step))
        _step(optimizer, 0.0)
    saved = copy.deepcopy(optimizer.state_dict())
    clone_params = [nn.Parameter(p.detach().clone()) for p in params]
    restored = _halfcast(name, implementation, clone_params)
    restored.load_state_dict(saved)
    _assert_same(_snapshot(params, optimizer), _snapshot(clone_params, restored))
    assert all(isinstance(g["lr"], Tensor) and g["lr"].dtype == torch.float64 for g in restored.param_groups)
    for step in (3, 4):
        _set_grads(params, _grads(step))
        _set_grads(clone_params, _grads(step))
        _step(optimizer, 0.0)
        _step(restored, 0.0)
    _assert_same(_snapshot(params, optimizer), _snapshot(clone_params, restored))


@pytest.mark.parametrize("factory", [lambda p: AdamW(p, lr=1e-3), lambda p: SGD(p, lr=0.1, momentum=0.9)])
def test_a_parameter_without_gradient_is_refused(
    factory: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
) -> None:
    params = _params()
    optimizer = factory(params)
    _set_grads(params[:-1], _grads(1)[:-1])
    with pytest.raises(ValueError, match="no gradient"):
        optimizer.step()


def test_unscaled_gradients_only_and_fused_support() -> None:
    params = _params()
    optimizer = AdamW(params, lr=1e-3)
    _set_grads(params, _grads(1))
    optimizer.grad_scale = torch.tensor(2.0)  # type: ignore[attr-defined]  # the AMP protocol's attribute
    with pytest.raises(ValueError, match="unscaled"):
        optimizer.step()
    assert fused_supported(params) and not fused_supported([torch.zeros(2, dtype=torch.int64)])
    with pytest.raises(ValueError, match="implementation"):
        AdamW(params, lr=1e-3, implementation=cast(Implementation, "magic"))  # deliberately not one
