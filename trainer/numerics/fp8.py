"""fp8 training: Halfcast's own quantisation primitives, an emulated fp8 Linear, layer selection.

Three parts:

* **Primitives** (device-agnostic, run on CPU): ``amax`` (tensorwise, or rowwise along
  a dim), ``scale = format max / amax``, the scaled values **clamped to the format's
  finite range before the cast** (never relying on a saturating cast: torch's CPU cast
  to ``float8_e4m3fn`` silently saturates even ``inf`` to 448, its cast to
  ``float8_e5m2`` overflows to ``inf``), the cast, and dequantisation. A non-finite
  amax is an *overflow*: it is reported as a 0-d float32 flag on the tensor's device
  (1.0 = overflow; computed without a host synchronisation) and the non-finite values
  are stored as NaN, so they propagate instead of being silently saturated.
* **Emulation** for tests without fp8 hardware: :class:`Float8EmulatedLinear`, whose
  forward quantises input and weight in e4m3, dequantises and multiplies in the compute
  dtype, and whose backward quantises ``grad_output`` in e5m2. Every quantisation ORs
  its overflow into a shared :class:`Fp8OverflowFlag`, which the precision step ORs
  into the step's ``found_inf`` (so an fp8 overflow skips the step like an fp16 one).
* **Layer selection** (:func:`plan_fp8_layers`) with a per-layer report, and
  :func:`convert_to_fp8`: torchao's ``convert_to_float8_training`` on CUDA (compute
  capability >= 8.9), or the emulated Linear when ``emulate=True``.

Formats (Micikevicius et al., "FP8 Formats for Deep Learning", 2022, arXiv:2209.05433):
E4M3 (``torch.float8_e4m3fn``, max 448, 3 mantissa bits) for weights and activations,
E5M2 (``torch.float8_e5m2``, max 57344, 2 mantissa bits) for gradients. Recipes follow
torchao's float8 training docs (``Float8LinearRecipeName``): ``tensorwise`` (one dynamic
scale per tensor) and ``rowwise`` (one scale per row of each GEMM operand along the
contraction dimension, scales rounded down to powers of two). Unlike torchao's rowwise
recipe (e4m3 everywhere), the emulation keeps E5M2 for gradients in both recipes, as the
paper recommends; on CUDA torchao's recipe runs as torchao defines it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import torch
from torch import Tensor, nn

log = logging.getLogger(__name__)

Fp8Recipe = Literal["tensorwise", "rowwise"]
#: E4M3 for weights and activations, E5M2 for gradients (arXiv:2209.05433 §3).
E4M3: torch.dtype = torch.float8_e4m3fn
E5M2: torch.dtype = torch.float8_e5m2
#: Floor of amax in the scale computation, so ``max / amax`` stays finite in float32.
AMAX_EPS = 1e-12
#: fp8 GEMMs need both Linear dimensions to be multiples of 16.
FP8_DIM_MULTIPLE = 16


def format_max(dtype: torch.dtype) -> float:
    """Largest finite value of an fp8 ``dtype`` (448.0 for E4M3, 57344.0 for E5M2).

    Raises:
        ValueError: ``dtype`` is not one of the two fp8 training formats.
    """
    if dtype not in (E4M3, E5M2):
        raise ValueError(f"not an fp8 training format: {dtype}")
    return float(torch.finfo(dtype).max)


# ----------------------------------------------------------------------------- primitives


def amax(x: Tensor, dim: int | None = None) -> Tensor:
    """Largest absolute value of ``x`` as float32: a 0-d tensor (``dim=None``, tensorwise)
    or reduced along ``dim`` with the dim kept (rowwise; shape of ``x`` with size 1 at ``dim``).

    NaN in a reduced slice gives NaN, ``inf`` gives ``inf``.
    """
    magnitude = x.detach().abs().float()
    return magnitude.amax() if dim is None else magnitude.amax(dim=dim, keepdim=True)


def scale_from_amax(amax_value: Tensor, dtype: torch.dtype, *, power_of_2: bool = False) -> Tensor:
    """The float32 scale ``format_max(dtype) / amax`` (same shape as ``amax_value``).

    Guards: an amax of 0 or a non-finite amax gives scale 1.0 (the overflow is reported
    by :func:`overflow_flag`); amax is floored at :data:`AMAX_EPS` so the scale stays
    finite. ``power_of_2`` rounds the scale down to a power of two (exact rescaling).
    """
    fmax = format_max(dtype)
    scale = fmax / amax_value.float().clamp(min=AMAX_EPS)
    if power_of_2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    usable = torch.isfinite(amax_value) & (amax_value > 0)
    return torch.where(usable, scale, torch.ones_like(scale))


def overflow_flag(amax_value: Tensor) -> Tensor:
    """0-d float32 tensor on ``amax_value``'s device: 1.0 if any amax is non-finite, else 0.0 (no host sync)."""
    return (~torch.isfinite(amax_value)).any().float()


def cast_to_fp8(scaled: Tensor, dtype: torch.dtype) -> Tensor:
    """Cast already-scaled values to ``dtype``: finite values clamped to ``[-max, max]``
    *before* the cast, non-finite values stored as NaN (E4M3FN has no infinity).

    Shape unchanged; the result has dtype ``dtype``.
    """
    fmax = format_max(dtype)
    scaled = scaled.float()
    clamped = scaled.clamp(-fmax, fmax)
    return torch.where(torch.isfinite(scaled), clamped, torch.full_like(scaled, math.nan)).to(dtype)


@dataclass(frozen=True)
class Quantized:
    """An fp8 tensor with its scale: ``data ≈ original * scale``.

    Attributes:
        data: fp8 values (``E4M3`` or ``E5M2``), the original shape.
        scale: float32, 0-d (tensorwise) or broadcastable to ``data`` (rowwise).
        overflow: 0-d float32, 1.0 when the amax was non-finite.
    """

    data: Tensor
    scale: Tensor
    overflow: Tensor

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """``data / scale`` in ``dtype`` (computed in float32); NaN where the input was non-finite."""
        return (self.data.float() / self.scale).to(dtype)


def quantize(x: Tensor, dtype: torch.dtype, dim: int | None = None, *, power_of_2: bool = False) -> Quantized:
    """Dynamic fp8 quantisation of ``x`` (any float dtype and shape) to ``dtype``.

    ``dim=None``: tensorwise (one scale); else rowwise, one scale per slice along
    ``dim`` (e.g. ``dim=-1`` for per-token scales of activations ``[..., K]``, ``dim=1``
    for per-output-row scales of a weight ``[N, K]``). Never syncs the host.
    """
    a = amax(x, dim)
    scale = scale_from_amax(a, dtype, power_of_2=power_of_2)
    return Quantized(data=cast_to_fp8(x.float() * scale, dtype), scale=scale, overflow=overflow_flag(a))


def quantize_with_scale(x: Tensor, scale: Tensor | float, dtype: torch.dtype) -> Quantized:
    """fp8 quantisation with a given scale (e.g. a delayed or static one): values beyond
    the format's range after scaling become ``±max``, not ``inf``/NaN; the overflow flag
    reports non-finite values of ``x``."""
    scale_t = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    return Quantized(data=cast_to_fp8(x.float() * scale_t, dtype), scale=scale_t, overflow=overflow_flag(amax(x)))


# ----------------------------------------------------------------------------- overflow flag


class Fp8OverflowFlag:
    """A 0-d float32 device tensor shared by the fp8 layers of a model: 1.0 after any
    fp8 quantisation since the last :meth:`reset` saw a non-finite amax.

    The precision step ORs :attr:`value` into its ``found_inf`` before the cross-rank
    max-reduce and clears it (the fp8 policy adds ``flag.consume`` as an overflow source). Nothing here
    syncs the host.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.value = torch.zeros((), dtype=torch.float32, device=device)

    def record(self, flag: Tensor) -> None:
        """OR ``flag`` (0-d, 0.0 or 1.0) into the shared flag, in place."""
        torch.maximum(self.value, flag.to(self.value.device), out=self.value)

    def reset(self) -> None:
        """Clear the flag (after the optimizer step decided)."""
        self.value.zero_()

    def consume(self) -> Tensor:
        """The flag so far (a copy) and a cleared flag: the precision step's overflow source, once per step."""
        value = self.value.clone()
        self.value.zero_()
        return value


# ----------------------------------------------------------------------------- emulated Linear


def _dims(recipe: Fp8Recipe, dim: int) -> int | None:
    return dim if recipe == "rowwise" else None


def _fake_quantize(x: Tensor, dtype: torch.dtype, dim: int | None, out: torch.dtype, flag: Fp8OverflowFlag) -> Tensor:
    q = quantize(x, dtype, dim, power_of_2=dim is not None)
    flag.record(q.overflow)
    return q.dequantize(out)


class _Fp8Matmul(torch.autograd.Function):
    """``x2d @ w.T`` with every GEMM operand quantised (emulated: dequantised before the matmul).

    Rowwise scales run along each GEMM's contraction dimension, as a rowwise fp8 kernel
    needs: forward ``x[M,K] @ w.T``: x per row (dim 1), w per row (dim 1); grad_input
    ``g[M,N] @ w[N,K]``: g per row, w per column (dim 0); grad_weight ``g.T @ x``: g and
    x per column (dim 0). Tensorwise uses one scale per operand.
    """

    @staticmethod
    def forward(
        ctx: Any, x2d: Tensor, weight: Tensor, recipe: Fp8Recipe, compute: torch.dtype, flag: Fp8OverflowFlag
    ) -> Tensor:
        ctx.save_for_backward(x2d, weight)
        ctx.recipe, ctx.compute, ctx.flag = recipe, compute, flag
        xq = _fake_quantize(x2d, E4M3, _dims(recipe, 1), compute, flag)
        wq = _fake_quantize(weight, E4M3, _dims(recipe, 1), compute, flag)
        return xq @ wq.t()

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x2d, weight = ctx.saved_tensors
        recipe, compute, flag = ctx.recipe, ctx.compute, ctx.flag
        grad_input = grad_weight = None
        if ctx.needs_input_grad[0]:
            g = _fake_quantize(grad_out, E5M2, _dims(recipe, 1), compute, flag)
            w = _fake_quantize(weight, E4M3, _dims(recipe, 0), compute, flag)
            grad_input = (g @ w).to(x2d.dtype)
        if ctx.needs_input_grad[1]:
            g = _fake_quantize(grad_out, E5M2, _dims(recipe, 0), compute, flag)
            x = _fake_quantize(x2d, E4M3, _dims(recipe, 0), compute, flag)
            grad_weight = (g.t() @ x).to(weight.dtype)
        return grad_input, grad_weight, None, None, None


def fp8_linear(x: Tensor, weight: Tensor, bias: Tensor | None, recipe: Fp8Recipe, flag: Fp8OverflowFlag) -> Tensor:
    """Emulated fp8 ``F.linear``: ``x [..., K]``, ``weight [N, K]``, ``bias [N]`` → ``[..., N]``.

    The matmul runs on fp8-quantised operands (E4M3 forward, E5M2 ``grad_output``)
    dequantised to the compute dtype: the autocast dtype when autocast is on, else
    ``x``'s dtype. The bias is added in high precision (as torchao does).
    """
    device_type = x.device.type
    compute = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
    with torch.autocast(device_type=device_type, enabled=False):
        out2d = _Fp8Matmul.apply(x.reshape(-1, x.shape[-1]), weight, recipe, compute, flag)
        out = out2d.reshape(*x.shape[:-1], weight.shape[0])
        if bias is not None:
            out = out + bias.to(out.dtype)
    return out


class Float8EmulatedLinear(nn.Linear):
    """``nn.Linear`` computing through :func:`fp8_linear`; parameters stay as they were (fp32 master weights).

    ``overflow`` is the shared :class:`Fp8OverflowFlag` this layer records into.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        recipe: Fp8Recipe = "tensorwise",
        overflow: Fp8OverflowFlag | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.recipe: Fp8Recipe = recipe
        self.overflow = overflow if overflow is not None else Fp8OverflowFlag(self.weight.device)

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: Fp8Recipe, overflow: Fp8OverflowFlag) -> Float8EmulatedLinear:
        """A Float8EmulatedLinear sharing ``linear``'s parameter objects (no copy)."""
        with torch.device("meta"):
            new = cls(
                linear.in_features, linear.out_features, bias=linear.bias is not None, recipe=recipe, overflow=overflow
            )
        new.weight = linear.weight
        new.bias = linear.bias
        return new

    def forward(self, x: Tensor) -> Tensor:
        return fp8_linear(x, self.weight, self.bias, self.recipe, self.overflow)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe}"


# ----------------------------------------------------------------------------- selection and conversion


class Fp8LayerReport(TypedDict):
    """One ``nn.Linear`` of the model: does it run in fp8, and why (or why not)."""

    module: str
    fp8: bool
    why: str


#: Module-path segments of PEFT's adapter layers and trainable copies: these Linears stay in bf16.
ADAPTER_SEGMENTS = frozenset({"lora_A", "lora_B", "modules_to_save", "original_module"})


def is_adapter_layer(name: str) -> bool:
    """Whether module path ``name`` is inside a PEFT adapter (``lora_A``/``lora_B``) or a trainable copy
    (``modules_to_save``, with the ``original_module`` it replaces)."""
    return not ADAPTER_SEGMENTS.isdisjoint(name.split("."))


def plan_fp8_layers(model: nn.Module) -> list[Fp8LayerReport]:
    """Which ``nn.Linear`` layers of ``model`` run in fp8, in module order.

    Kept in bf16: adapter layers (a LoRA factor has rank ``r``: quantising it would cost the adapter
    its precision, and its GEMMs are a sliver of the base's) and trainable head copies; of the
    others, the first and the last Linear (the most sensitive to quantisation) and any Linear whose
    ``in_features`` or ``out_features`` is not a multiple of 16 (fp8 GEMM requirement). All others
    are eligible: in a LoRA model these are the frozen base layers the adapters wrap.
    """
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    base = [name for name, _ in linears if not is_adapter_layer(name)]
    first, last = (base[0], base[-1]) if base else (None, None)
    report: list[Fp8LayerReport] = []
    for name, module in linears:
        if is_adapter_layer(name):
            why, fp8 = "adapter layer: kept in bf16", False
        elif name == first:
            why, fp8 = "first Linear: kept in bf16", False
        elif name == last:
            why, fp8 = "last Linear: kept in bf16", False
        elif module.in_features % FP8_DIM_MULTIPLE or module.out_features % FP8_DIM_MULTIPLE:
            shape = f"{module.in_features}x{module.out_features}"
            why, fp8 = f"in/out features {shape} not divisible by {FP8_DIM_MULTIPLE}: kept in bf16", False
        else:
            why, fp8 = "eligible", True
        report.append({"module": name, "fp8": fp8, "why": why})
    return report


@dataclass(frozen=True)
class Fp8Conversion:
    """What :func:`convert_to_fp8` did: the per-layer report, and the overflow flag (emulation only)."""

    report: list[Fp8LayerReport]
    overflow: Fp8OverflowFlag | None

    @property
    def fp8_modules(self) -> list[str]:
        """Names of the Linear layers that run in fp8."""
        return [row["module"] for row in self.report if row["fp8"]]


def convert_to_fp8(model: nn.Module, recipe: Fp8Recipe = "tensorwise", *, emulate: bool = False) -> Fp8Conversion:
    """Swap the Linear layers :func:`plan_fp8_layers` chooses, in place.

    ``emulate=False`` (CUDA, compute capability >= 8.9): torchao's
    ``convert_to_float8_training(model, module_filter_fn=..., config=Float8LinearConfig.from_recipe_name(recipe))``;
    the overflow flag is ``None`` (torchao reports none; non-finite values reach the
    gradients, where the precision step finds them). ``emulate=True``:
    :class:`Float8EmulatedLinear` sharing the original parameters, all recording into
    one returned :class:`Fp8OverflowFlag` on the model's device.

    Raises:
        ImportError: ``emulate=False`` without torchao installed.
    """
    report = plan_fp8_layers(model)
    chosen = {row["module"] for row in report if row["fp8"]}
    overflow: Fp8OverflowFlag | None = None
    if emulate:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        overflow = Fp8OverflowFlag(device)
        for name in chosen:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            setattr(parent, child, Float8EmulatedLinear.from_linear(getattr(parent, child), recipe, overflow))
    else:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        def keep(module: nn.Module, fqn: str) -> bool:
            return fqn in chosen

        convert_to_float8_training(model, module_filter_fn=keep, config=Float8LinearConfig.from_recipe_name(recipe))
    log.info(
        "fp8 (%s%s): %d of %d Linear layers converted: %s",
        recipe,
        ", emulated" if emulate else "",
        len(chosen),
        len(report),
        sorted(chosen),
    )
    return Fp8Conversion(report=report, overflow=overflow)
