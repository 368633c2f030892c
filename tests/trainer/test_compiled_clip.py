"""``compile: true``'s compiled check and clip (trainer/compiled_clip.py): one whole graph, the eager step's decisions.

On the CPU the graph is traced with ``aot_eager`` (the same aten ops, no code generation: cheap, and a graph
break fails it as Inductor would); the CUDA case with Inductor is marked ``gpu``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from trainer_support import grad_of

from trainer.compiled_clip import check_and_clip, compilable, compile_check
from trainer.numerics.loss_scale import DynamicLossScaler
from trainer.numerics.precision import Fp16Precision
from trainer.numerics.step_outcome import HostStepOutcome
from trainer.optim.skipping import AdamW

CPU = torch.device("cpu")


def _grads(fill: float | None = None) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(shape, generator=g) * 5 for shape in ((8, 4), (8,), (3, 8), (3,))]
    if fill is not None:
        grads[2].view(-1)[4] = fill
    return grads


@pytest.mark.parametrize("fill", [None, float("inf"), float("nan")])
@pytest.mark.parametrize("max_grad_norm", [1.0, None])
def test_the_check_traces_as_one_graph_and_equals_the_eager_ops(
    fill: float | None, max_grad_norm: float | None
) -> None:
    """fullgraph: no graph break (the check reads nothing on the host); aot_eager runs the same aten ops, so norms,
    flag and clipped gradients are bit-identical to the eager function's, for clean, infinite and NaN gradients."""
    compiled = compile_check("aot_eager")
    eager_grads, compiled_grads = _grads(fill), _grads(fill)
    eager, traced = check_and_clip(eager_grads, max_grad_norm), compiled(compiled_grads, max_grad_norm)
    for a, b in zip(eager, traced, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)
    assert traced.flag.item() == (0.0 if fill is None else 1.0)
    for a, b in zip(eager_grads, compiled_grads, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)
    if max_grad_norm is not None and fill is None:
        assert torch.linalg.vector_norm(torch.stack([g.norm() for g in compiled_grads])).item() == pytest.approx(1.0)


def test_only_plain_float32_gradients_on_one_device_are_compiled() -> None:
    assert compilable(_grads()) and not compilable([]) and not compilable([torch.ones(2, dtype=torch.bfloat16)])


def _run(compiled: bool) -> tuple[list[HostStepOutcome], list[torch.Tensor]]:
    """Six fp16 steps of a tiny model, an inf injected at step 3, clipping to 0.5."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    params = list(model.parameters())
    policy = Fp16Precision(CPU, DynamicLossScaler(init_scale=2.0**10, growth_interval=2))
    if compiled:
        policy.compile_step("aot_eager")
    optimizer = AdamW(params, lr=1e-2, implementation="fused")
    outcomes = []
    for step in range(1, 7):
        with policy.autocast():
            loss = model(torch.ones(4, 8) * step).float().sum()
        policy.backward(loss)
        if step == 3:
            grad_of(params[0]).view(-1)[0] = float("inf")
        outcomes.append(policy.step(optimizer, params, 0.5, step=step).to_host())
        optimizer.clear_grads()
    return outcomes, [p.detach().clone() for p in params]


def test_a_compiled_step_takes_the_eager_steps_decisions() -> None:
    """The precision step with the compiled check: the same skip, scale, norm and skipped count at every step,
    and the same weights, as the eager step (aot_eager: bit for bit; Inductor may differ in the last bits)."""
    (eager, eager_params), (compiled, compiled_params) = _run(False), _run(True)
    assert compiled == eager and [o.overflow for o in eager] == [False, False, True, False, False, False]
    assert all(torch.equal(a, b) for a, b in zip(eager_params, compiled_params, strict=True))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_inductor_compiles_the_check_on_cuda_and_agrees_within_tolerance() -> None:
    """Inductor on CUDA, under the sync debugger: no host sync; norms within float32 reduction noise, the same flag."""
    compiled = compile_check()
    for fill in (None, float("inf")):
        eager_grads = [g.cuda() for g in _grads(fill)]
        compiled_grads = [g.clone() for g in eager_grads]
        eager = check_and_clip(eager_grads, 1.0)
        compiled(compiled_grads, 1.0)  # compiles
        torch.cuda.set_sync_debug_mode("error")
        try:
            traced = (
                compiled([g.clone() for g in compiled_grads], 1.0) if fill is None else compiled(compiled_grads, 1.0)
            )
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert traced.flag.item() == eager.flag.item()
        if fill is None:
            assert torch.allclose(traced.total, eager.total, rtol=1e-5)
