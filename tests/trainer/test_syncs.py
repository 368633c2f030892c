"""Host synchronisations per optimizer step: zero in steady state, one batched copy per flush.

On CPU a "sync" is a read of a tensor's value on the host: ``aten::_local_scalar_dense``
(``.item()``, ``float(t)``, ``bool(t)``, ``int(t)``), counted with a dispatch mode, and
``Tensor.tolist`` / ``Tensor.numpy`` / ``Tensor.cpu`` calls (``tolist`` bypasses the
dispatcher), counted by wrapping them. On CUDA, ``torch.cuda.set_sync_debug_mode("error")``
turns any synchronising call into an error (``gpu`` test).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from halfcast.contracts.spec import JobSpec
from trainer.components import build_components
from trainer.numerics.precision import build_precision
from trainer.parallel.distributed import DistContext
from trainer.run import loop
from trainer.run.step import record_step, train_step
from trainer.run.telemetry import StepLog
from trainer.sync_counter import HostSyncCounter as HostReads

PATHS = [(name, impl) for name in ("adamw", "sgd") for impl in ("plain", "foreach", "fused")]


def _spec(
    tiny_mlp_spec: Callable[..., JobSpec], precision: str, name: str, implementation: str, **extra: Any
) -> JobSpec:
    scaling = {"loss_scale": {"init_scale": 1024.0, "growth_interval": 3}} if precision == "fp16" else {}
    return tiny_mlp_spec(
        precision=precision,
        optimizer={
            "name": name,
            "lr": 0.01,
            "momentum": 0.9 if name == "sgd" else 0.0,
            "weight_decay": 0.01,
            "implementation": implementation,
        },
        lr_scheduler={"name": "cosine", "warmup_steps": 2},
        max_grad_norm=1.0,
        **scaling,
        **extra,
    )


@contextlib.contextmanager
def _count_loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[int]]]:
    """Per step: host reads in ``train_step`` + ``record_step``; per flush: reads in ``StepLog.drain``."""
    counts: dict[str, list[int]] = {"steps": [], "scalar_reads_per_flush": [], "copies_per_flush": []}
    pending: dict[int, int] = {}

    def counted_step(*args: Any, **kwargs: Any) -> Any:
        with HostReads() as reads:
            result = train_step(*args, **kwargs)
        pending[kwargs["step"]] = reads.total
        return result

    def counted_record(step_log: StepLog, step: int, result: Any) -> None:
        with HostReads() as reads:
            record_step(step_log, step, result)
        counts["steps"].append(pending.pop(step) + reads.total)

    original_drain = StepLog.drain

    def counted_drain(self: StepLog) -> Any:
        if not self.pending:
            return original_drain(self)
        with HostReads() as reads:
            rows = original_drain(self)
        counts["scalar_reads_per_flush"].append(reads.scalar_reads)
        counts["copies_per_flush"].append(reads.copies)
        return rows

    monkeypatch.setattr(loop, "train_step", counted_step)
    monkeypatch.setattr(loop, "record_step", counted_record)
    monkeypatch.setattr(StepLog, "drain", counted_drain)
    yield counts


@pytest.mark.parametrize(("name", "implementation"), PATHS)
@pytest.mark.parametrize("precision", ["fp16", "fp32", "bf16"])
def test_no_host_read_in_any_step_and_one_copy_per_flush(
    precision: str,
    name: str,
    implementation: str,
    tiny_mlp_spec: Callable[..., JobSpec],
    cpu_ctx: DistContext,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """7 steps (an injected overflow at step 3), log_interval 3: flushes after steps 1 (the first step ends
    the start-up), 3, 6 and 7."""
    spec = _spec(
        tiny_mlp_spec,
        precision,
        name,
        implementation,
        max_steps=7,
        log_interval=3,
        faults={"nonfinite_grad_steps": [3]},
    )
    with _count_loop(monkeypatch) as counts:
        result = loop.train(spec, tmp_path, cpu_ctx)
    assert result.skipped_steps == 1
    assert counts["steps"] == [0] * 7
    assert counts["scalar_reads_per_flush"] == [0, 0, 0, 0]
    assert counts["copies_per_flush"] == [1, 1, 1, 1]


@pytest.mark.parametrize("implementation", ["fused", "foreach"])
def test_token_data_with_accumulation_makes_no_host_read(
    implementation: str, cpu_ctx: DistContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small GPT on text (bf16, 2 micro-batches per step): token counts and losses stay on the device too."""
    spec = JobSpec.model_validate(
        {
            "model": {"name": "gpt", "config": {"n_layer": 1, "n_head": 2, "d_model": 32}},
            "dataset": {"name": "text", "config": {"seq_len": 16, "max_bytes": 20000, "test_fraction": 0.05}},
            "precision": "bf16",
            "micro_batch_size": 4,
            "gradient_accumulation_steps": 2,
            "max_steps": 4,
            "log_interval": 2,
            "optimizer": {"name": "adamw", "implementation": implementation},
            "lr_scheduler": {"name": "linear", "warmup_steps": 1},
        }
    )
    with _count_loop(monkeypatch) as counts:
        loop.train(spec, tmp_path, cpu_ctx)
    assert counts["steps"] == [0] * 4
    assert counts["scalar_reads_per_flush"] == [0, 0, 0] and counts["copies_per_flush"] == [1, 1, 1]  # after 1, 2, 4


def test_an_optimizer_without_device_skip_costs_one_read_per_step(
    tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext
) -> None:
    """PyTorch's non-fused AdamW cannot take ``found_inf``: the policy falls back to one host read (and
    PyTorch's own bias correction reads every step counter), the cost Halfcast's optimizers remove."""
    parts = build_components(_spec(tiny_mlp_spec, "fp16", "adamw", "foreach"), cpu_ctx)
    reference = torch.optim.AdamW(parts.parameters, lr=0.01, foreach=True)
    policy = build_precision(_spec(tiny_mlp_spec, "fp16", "adamw", "foreach"), cpu_ctx.device)
    batches = next(parts.dataset.train_batches(16, rank=0, world_size=1, seed=0))
    reads = []
    for _ in range(3):
        loss = parts.loss_fn(parts.model, batches) / 16
        policy.backward(loss)
        with HostReads() as counter:
            policy.step(reference, parts.parameters, None)
        reference.zero_grad(set_to_none=True)
        reads.append(counter.total)
    assert reads[0] >= 1 and all(r >= 1 + len(parts.parameters) for r in reads[1:])


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "implementation"), [("adamw", "fused"), ("adamw", "foreach"), ("sgd", "plain")])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_cuda_steady_state_steps_never_synchronise(
    precision: str, name: str, implementation: str, tiny_mlp_spec: Callable[..., JobSpec]
) -> None:
    """Steps 4-12 under ``torch.cuda.set_sync_debug_mode("error")``: any synchronising call raises.

    The windows are moved to the GPU beforehand (data loading is the input pipeline's
    business); the step's own host-to-device copy of the window counts is inside.
    """
    ctx = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cuda", 0))
    spec = _spec(tiny_mlp_spec, precision, name, implementation, gpus=1, max_steps=12, log_interval=12)
    parts = build_components(spec, ctx)
    stream = loop._train_windows(parts.dataset, spec, ctx)
    windows = [loop._next_window(stream, ctx.device) for _ in range(12)]
    step_log = StepLog(spec.log_interval, ctx.device)
    try:
        for step, micro_batches in enumerate(windows, start=1):
            if step == 4:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            result = train_step(parts, micro_batches, step=step, max_grad_norm=1.0, dist_ctx=ctx)
            record_step(step_log, step, result)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    rows = step_log.drain()
    assert [r.step for r in rows] == list(range(1, 13))
    assert all(r.loss == r.loss for r in rows)  # real values came back
