"""fp8 quantisation primitives, the emulated fp8 Linear and layer selection (trainer/numerics/fp8.py), on CPU.

torchao's conversion on a capable GPU is checked by the ``gpu``-marked tests at the end.
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError
from torch import nn
from trainer_support import grad_of

from halfcast.contracts.spec import JobSpec
from trainer.numerics.fp8 import (
    E4M3,
    E5M2,
    Float8EmulatedLinear,
    Fp8OverflowFlag,
    Fp8Recipe,
    amax,
    cast_to_fp8,
    convert_to_fp8,
    format_max,
    fp8_linear,
    plan_fp8_layers,
    quantize,
    quantize_with_scale,
    scale_from_amax,
)

#: Relative rounding error of a normal value: half an ulp, 2^-(mantissa bits + 1).
REL_ERROR = {E4M3: 2.0**-4, E5M2: 2.0**-3}


def _spread(n: int = 4096, seed: int = 0) -> torch.Tensor:
    """Values of both signs whose magnitudes span [2^-8, 1]: all normal after scaling in both formats."""
    g = torch.Generator().manual_seed(seed)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    return sign * torch.exp2(-8 * torch.rand(n, generator=g))


# ----------------------------------------------------------------------------- primitives


def test_format_max_and_rejects_other_dtypes() -> None:
    assert format_max(E4M3) == 448.0 and format_max(E5M2) == 57344.0
    with pytest.raises(ValueError, match="fp8"):
        format_max(torch.float16)


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_quantise_dequantise_error_is_within_half_an_ulp(dtype: torch.dtype) -> None:
    x = _spread() * 1e-3  # far from the format's range: only the scale brings it there
    q = quantize(x, dtype)
    assert q.data.dtype == dtype and q.scale.shape == () and q.overflow.item() == 0.0
    assert torch.allclose(q.scale, format_max(dtype) / x.abs().max())
    back = q.dequantize()
    rel = ((back - x).abs() / x.abs()).max().item()
    assert rel <= REL_ERROR[dtype]
    assert rel > REL_ERROR[dtype] / 8  # it really went through fp8, not a no-op


def test_amax_tensorwise_and_rowwise() -> None:
    x = torch.tensor([[1.0, -3.0], [0.5, 0.25]])
    assert amax(x).item() == 3.0 and amax(x).dtype == torch.float32
    torch.testing.assert_close(amax(x, dim=1), torch.tensor([[3.0], [0.5]]))
    torch.testing.assert_close(amax(x, dim=0), torch.tensor([[1.0, 3.0]]))


def test_zero_amax_gives_a_finite_scale_and_zeros() -> None:
    q = quantize(torch.zeros(8), E4M3)
    assert q.scale.item() == 1.0 and q.overflow.item() == 0.0
    assert torch.equal(q.dequantize(), torch.zeros(8))
    tiny = quantize(torch.full((4,), 1e-42), E4M3)  # float32 subnormal amax: scale floored, still finite
    assert math.isfinite(tiny.scale.item())


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_values_beyond_the_range_are_clamped_before_the_cast(dtype: torch.dtype) -> None:
    fmax = format_max(dtype)
    x = torch.tensor([1e9, -1e9, 2 * fmax, 1.0])
    q = quantize_with_scale(x, 1.0, dtype)  # a stale scale: values land beyond the range
    assert q.overflow.item() == 0.0  # the values were finite: not an overflow
    assert q.dequantize().tolist() == [fmax, -fmax, fmax, 1.0]  # the max, not inf or NaN
    assert torch.isfinite(cast_to_fp8(torch.tensor([1e30, -1e30]), dtype).float()).all()


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_nonfinite_amax_is_an_overflow_never_silently_saturated(bad: float, dtype: torch.dtype) -> None:
    x = torch.tensor([0.5, bad, -2.0])
    q = quantize(x, dtype)
    assert q.overflow.dtype == torch.float32 and q.overflow.shape == () and q.overflow.item() == 1.0
    back = q.dequantize()
    assert not math.isfinite(back[1].item())  # NaN, not ±max: the bad value propagates
    assert back[0].item() == 0.5 and back[2].item() == -2.0  # scale 1 for a non-finite amax
    # torch's own cast would have saturated: the reason cast_to_fp8 exists.
    if dtype == E4M3 and bad == math.inf:
        assert torch.tensor([bad]).to(E4M3).float().item() == 448.0


def test_rowwise_overflow_flags_the_whole_tensor_and_keeps_other_rows() -> None:
    x = torch.tensor([[1.0, 2.0], [math.inf, 1.0]])
    q = quantize(x, E4M3, dim=1)
    assert q.overflow.item() == 1.0
    torch.testing.assert_close(q.dequantize()[0], x[0])


def test_rowwise_is_more_accurate_than_tensorwise_on_rows_of_different_magnitudes() -> None:
    rows = torch.stack([_spread(256, seed) * 10.0**-exp for seed, exp in enumerate(range(0, 8, 2))])
    errors = {}
    for name, dim in (("tensorwise", None), ("rowwise", 1)):
        back = quantize(rows, E4M3, dim).dequantize()
        errors[name] = ((back - rows).norm(dim=1) / rows.norm(dim=1)).max().item()
    assert errors["rowwise"] <= REL_ERROR[E4M3]
    assert errors["tensorwise"] > 10 * errors["rowwise"]


def test_power_of_2_scale_rounds_down() -> None:
    s = scale_from_amax(torch.tensor([[3.0], [0.001]]), E4M3, power_of_2=True)
    assert torch.equal(torch.log2(s), torch.floor(torch.log2(s)))
    assert (s <= 448.0 / torch.tensor([[3.0], [0.001]])).all()


# ----------------------------------------------------------------------------- emulated linear


def test_fp8_linear_forward_and_backward_are_close_to_the_exact_linear() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 32, generator=g, requires_grad=True)
    w = torch.randn(16, 32, generator=g, requires_grad=True)
    b = torch.randn(16, generator=g, requires_grad=True)
    flag = Fp8OverflowFlag()
    for recipe in ("tensorwise", "rowwise"):
        out = fp8_linear(x, w, b, recipe, flag)
        ref = torch.nn.functional.linear(x, w, b)
        assert out.shape == (3, 5, 16) and out.dtype == torch.float32
        assert ((out - ref).norm() / ref.norm()).item() < 0.06
        grads = torch.autograd.grad(out.square().sum(), (x, w, b))
        refs = torch.autograd.grad(ref.square().sum(), (x, w, b))
        for got, exact in zip(grads, refs, strict=True):
            assert got.dtype == torch.float32
            assert ((got - exact).norm() / exact.norm()).item() < 0.15
        assert ((grads[2] - refs[2]).norm() / refs[2].norm()).item() < 0.1  # bias grad: no fp8 GEMM
    assert flag.value.item() == 0.0


def test_fp8_linear_backward_quantises_grad_output_in_e5m2_and_operands_in_e4m3() -> None:
    """Tensorwise, fp32 compute: each gradient is exactly the product of the dequantised operands."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 32, generator=g, requires_grad=True)
    w = torch.randn(16, 32, generator=g, requires_grad=True)
    grad_out = torch.randn(8, 16, generator=g)
    out = fp8_linear(x, w, None, "tensorwise", Fp8OverflowFlag())
    dq = {
        name: quantize(t.detach(), dtype).dequantize()
        for name, t, dtype in (("x", x, E4M3), ("w", w, E4M3), ("g", grad_out, E5M2))
    }
    torch.testing.assert_close(out, dq["x"] @ dq["w"].t(), rtol=0, atol=0)
    grad_x, grad_w = torch.autograd.grad(out, (x, w), grad_out)
    torch.testing.assert_close(grad_x, dq["g"] @ dq["w"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_w, dq["g"].t() @ dq["x"], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(grad_x, grad_out @ w.detach(), rtol=1e-3, atol=1e-3)  # really quantised


def test_overflow_in_grad_output_is_flagged_for_the_input_gradient_alone() -> None:
    flag = Fp8OverflowFlag()
    x = torch.randn(2, 16, requires_grad=True)
    w = torch.randn(16, 16)  # no weight gradient: only the grad_input GEMM runs
    out = fp8_linear(x, w, None, "rowwise", flag)
    grad = torch.ones_like(out)
    grad[1, 0] = math.nan
    out.backward(grad)
    assert flag.value.item() == 1.0


def test_fp8_linear_under_autocast_computes_in_the_autocast_dtype() -> None:
    layer = Float8EmulatedLinear(32, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(torch.randn(4, 32))
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.float32


def test_overflow_in_the_backward_grad_output_sets_the_flag() -> None:
    flag = Fp8OverflowFlag()
    layer = Float8EmulatedLinear(16, 16, overflow=flag)
    out = layer(torch.randn(2, 16))
    assert flag.value.item() == 0.0
    grad = torch.ones_like(out)
    grad[0, 3] = math.inf
    out.backward(grad)
    assert flag.value.item() == 1.0  # E5M2 grad_output had a non-finite amax
    assert not torch.isfinite(grad_of(layer.weight)).all()  # and it reached the gradient, not saturated away
    assert flag.consume().item() == 1.0 and flag.value.item() == 0.0  # read once, then cleared
    flag.record(torch.tensor(1.0))
    flag.reset()
    assert flag.value.item() == 0.0


def test_tiny_mlp_learns_with_emulated_fp8_linears() -> None:
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 16))
    x = torch.randn(512, 32)
    with torch.no_grad():
        y = teacher(x)
    flag = Fp8OverflowFlag()
    student = nn.Sequential(
        Float8EmulatedLinear(32, 64, recipe="rowwise", overflow=flag),
        nn.ReLU(),
        Float8EmulatedLinear(64, 64, recipe="tensorwise", overflow=flag),
        nn.ReLU(),
        Float8EmulatedLinear(64, 16, recipe="rowwise", overflow=flag),
    )
    optimizer = torch.optim.AdamW(student.parameters(), lr=3e-3)
    losses = []
    for step in range(150):
        batch = slice((step * 64) % 512, (step * 64) % 512 + 64)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = student(x[batch])
        loss = (out.float() - y[batch]).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert flag.value.item() == 0.0
    assert all(p.dtype == torch.float32 for p in student.parameters())  # fp32 master weights
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.3 * first, (first, last)


# ----------------------------------------------------------------------------- selection


def _selection_model() -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(64, 64),  # first
        nn.ReLU(),
        nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64)),
        nn.Linear(64, 40),  # 40 is not a multiple of 16
        nn.Linear(40, 10),  # last
    )


def test_plan_keeps_first_last_and_odd_sizes_in_bf16() -> None:
    report = plan_fp8_layers(_selection_model())
    assert [(r["module"], r["fp8"]) for r in report] == [
        ("0", False),
        ("2.0", True),
        ("2.2", True),
        ("3", False),
        ("4", False),
    ]
    whys = {r["module"]: r["why"] for r in report}
    assert "first" in whys["0"] and "last" in whys["4"] and "16" in whys["3"] and whys["2.0"] == "eligible"


def test_emulated_conversion_swaps_exactly_the_planned_layers_sharing_parameters() -> None:
    model = _selection_model()
    weights = {name: m.weight for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    conversion = convert_to_fp8(model, "rowwise", emulate=True)
    assert conversion.fp8_modules == ["2.0", "2.2"]
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            assert isinstance(module, Float8EmulatedLinear) == (name in conversion.fp8_modules)
            assert module.weight is weights[name]
            if isinstance(module, Float8EmulatedLinear):
                assert module.recipe == "rowwise" and module.overflow is conversion.overflow
    assert conversion.overflow is not None
    x = torch.randn(2, 64)
    x[0, 0] = math.inf  # the bf16 first layer passes it on to the fp8 layers
    out = model(x)
    assert conversion.overflow.value.item() == 1.0
    assert not torch.isfinite(out).all()


def test_gpt_plan_respects_the_rules() -> None:
    from trainer.models.gpt import GPT

    report = plan_fp8_layers(GPT(vocab_size=32, context=8, n_layer=2, n_head=2, d_model=16))
    assert report[0] == {"module": "blocks.0.attn.qkv", "fp8": False, "why": "first Linear: kept in bf16"}
    assert report[-1]["module"] == "head" and not report[-1]["fp8"]
    assert all(r["fp8"] for r in report[1:-1])


# ----------------------------------------------------------------------------- the precision policy


def test_fp8_policy_converts_reports_and_skips_on_an_fp8_overflow() -> None:
    from halfcast.contracts.spec import OptimizerSpec
    from trainer.numerics.precision import Fp8Precision
    from trainer.optim.build import build_optimizer

    cpu = torch.device("cpu")
    policy = Fp8Precision(cpu, recipe="rowwise")
    model = policy.prepare_model(_selection_model())
    assert policy.fp8_report == plan_fp8_layers(_selection_model())
    assert policy.fp8_layers == ["2.0", "2.2"]
    fp8_layer = model.get_submodule("2.0")
    assert isinstance(fp8_layer, Float8EmulatedLinear) and fp8_layer.recipe == "rowwise"
    params = list(model.parameters())
    optimizer = build_optimizer(OptimizerSpec(name="sgd", lr=0.1), params)
    for fp8_overflow in (True, False):
        before = [p.detach().clone() for p in params]
        with policy.autocast():
            out = model(torch.randn(4, 64))
        policy.backward(out.float().square().mean())
        if fp8_overflow:  # an fp8 overflow that left the gradients finite
            fp8_layer.overflow.record(torch.tensor(1.0))
        outcome = policy.step(optimizer, params, None)
        optimizer.zero_grad(set_to_none=True)
        unchanged = all(torch.equal(a, b) for a, b in zip(before, params, strict=True))
        assert bool(outcome.overflow) == fp8_overflow and unchanged == fp8_overflow


# ----------------------------------------------------------------------------- spec


def _spec(**fields: object) -> JobSpec:
    return JobSpec.model_validate({"model": {"name": "mlp"}, "dataset": {"name": "digits"}, **fields})


def test_fp8_recipe_defaults_to_tensorwise_for_fp8_and_round_trips() -> None:
    assert _spec(precision="fp8", gpus=1).effective_fp8_recipe == "tensorwise"
    rowwise = _spec(precision="fp8", gpus=1, fp8_recipe="rowwise")
    assert rowwise.effective_fp8_recipe == "rowwise"
    for spec in (rowwise, _spec(precision="fp16"), _spec()):
        assert JobSpec.model_validate(spec.model_dump(mode="json")) == spec  # stored specs revalidate
    assert _spec(precision="bf16").effective_fp8_recipe is None


@pytest.mark.parametrize(
    "fields",
    [
        {"precision": "fp16", "fp8_recipe": "tensorwise"},
        {"fp8_recipe": "rowwise"},
        {"precision": "fp8", "gpus": 1, "fp8_recipe": "blockwise"},
    ],
)
def test_fp8_recipe_is_rejected_at_its_field(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as info:
        _spec(**fields)
    assert [e["loc"] for e in info.value.errors()] == [("fp8_recipe",)]


# ----------------------------------------------------------------------------- torchao on a capable GPU


def _fp8_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.gpu
@pytest.mark.skipif(not _fp8_gpu(), reason="needs a CUDA GPU with compute capability >= 8.9")
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_torchao_conversion_follows_the_plan(recipe: Fp8Recipe) -> None:
    pytest.importorskip("torchao.float8")
    from torchao.float8.float8_linear import Float8Linear

    model = _selection_model().cuda()
    conversion = convert_to_fp8(model, recipe)
    converted = [name for name, m in model.named_modules() if isinstance(m, Float8Linear)]
    assert converted == conversion.fp8_modules == ["2.0", "2.2"]
    assert conversion.overflow is None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(torch.randn(32, 64, device="cuda"))
    out.float().sum().backward()
    assert all(torch.isfinite(grad_of(p)).all() for p in model.parameters())
