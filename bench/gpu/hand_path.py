"""The hand-written baseline: plain PyTorch on the same model and batches as Halfcast's path.

Per step, PyTorch's AMP recipe: ``torch.autocast`` forward (bf16; fp16; fp8 = torchao's
``convert_to_float8_training`` on the Linears Halfcast converts, under bf16 autocast), mean
next-token loss in float32, ``torch.amp.GradScaler`` for fp16 (scale, backward, unscale),
``clip_grad_norm_`` to 1.0, ``scaler.step`` of fused ``torch.optim.AdamW``, ``scaler.update``,
``LambdaLR`` with Halfcast's cosine factor (advanced every step, skipped fp16 steps included, as
the plain recipe does), ``zero_grad(set_to_none=True)``. Under DDP the model is wrapped in
``DistributedDataParallel``. Nothing is logged; the loss is read once, after the timed steps.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bench.gpu.flops import count_flops, mfu
from bench.gpu.results import Measurement, PathResult, RowStatus
from bench.gpu.settings import CheckPrecision, CheckSettings, ModelKind, PathKind
from bench.gpu.steady import timed_steady_steps
from bench.gpu.syncs import SyncGuard
from bench.gpu.workloads import (
    COMPUTE_DTYPES,
    attention_shape,
    job_spec,
    mean_token_loss,
    plain_logits,
    plain_model,
    preload,
)
from trainer.data import Batch
from trainer.numerics.fp8 import plan_fp8_layers
from trainer.numerics.precision import PrecisionUnsupportedError, check_supported
from trainer.optim.schedule import LRMultiplier
from trainer.parallel.distributed import DistContext


def convert_fp8(model: nn.Module) -> int:
    """torchao's float8 training Linears (tensorwise) on the layers Halfcast's plan picks; how many."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    chosen = {row["module"] for row in plan_fp8_layers(model) if row["fp8"]}
    config = Float8LinearConfig.from_recipe_name("tensorwise")
    convert_to_float8_training(model, module_filter_fn=lambda _, fqn: fqn in chosen, config=config)
    return len(chosen)


class HandLoop:
    """The plain loop over ``model`` (already on ``ctx.device``) in ``precision``."""

    def __init__(
        self, model: nn.Module, kind: ModelKind, precision: CheckPrecision, settings: CheckSettings, ctx: DistContext
    ) -> None:
        self.kind = kind
        self.device = ctx.device
        self.dtype = COMPUTE_DTYPES[precision]
        self.fp8_layers = convert_fp8(model) if precision is CheckPrecision.FP8 else None
        self.module = model
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.model = DistributedDataParallel(model, device_ids=device_ids) if ctx.world_size > 1 else model
        if settings.compile:
            self.model = torch.compile(self.model)  # type: ignore[assignment]  # an OptimizedModule is called alike
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=3e-4, weight_decay=0.1, fused=True)
        factor = LRMultiplier(
            name="cosine", total_steps=settings.counts.warmup + settings.counts.steps, warmup_steps=2, min_lr_ratio=0.0
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=precision is CheckPrecision.FP16)
        self.loss = torch.zeros((), device=ctx.device)

    def step(self, batch: Batch) -> None:
        """One AMP step on ``batch``."""
        with torch.autocast(device_type=self.device.type, dtype=self.dtype):
            loss = mean_token_loss(plain_logits(self.model, self.kind, batch), batch.targets)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.loss = loss.detach()


def run_hand(model: ModelKind, precision: CheckPrecision, settings: CheckSettings, ctx: DistContext) -> PathResult:
    """Build the plain model and loop, warm up, then time the steady steps (syncs counted, not refused)."""
    row = PathResult(
        model=model,
        precision=precision,
        path=PathKind.HAND,
        status=RowStatus.SKIPPED,
        rank=ctx.rank,
        world_size=ctx.world_size,
    )
    try:
        check_supported(precision, ctx.device)
    except PrecisionUnsupportedError as exc:
        return row.model_copy(update={"reason": str(exc)})
    spec = job_spec(model, CheckPrecision.BF16, settings, ctx.world_size)  # the data only (fp8 refuses a dry run)
    batches = preload(spec, ctx.device, ctx.rank, ctx.world_size)
    loop = HandLoop(plain_model(model, settings, precision).to(ctx.device), model, precision, settings, ctx)
    guard = SyncGuard(ctx.device, strict=False)
    counts = settings.counts
    seconds = timed_steady_steps(
        lambda n: loop.step(batches[n % len(batches)]), counts.warmup, counts.steps, guard, ctx.device
    )
    n_layer, seq_len, d_model = attention_shape(model, settings)
    flops = count_flops(loop.module, n_layer, seq_len, d_model)
    tokens_per_s = counts.steps * spec.micro_batch_size * seq_len / seconds
    last_loss = float(loop.loss.item())
    measured = Measurement(
        steady_steps=counts.steps,
        step_ms=1e3 * seconds / counts.steps,
        tokens_per_s=tokens_per_s,
        flops_per_token=flops.per_token,
        matmul_params=flops.matmul_params,
        trainable_matmul_params=flops.trainable_matmul_params,
        mfu=mfu(flops.per_token, tokens_per_s, settings.peak_flops),
        sync_check=guard.method,
        syncs_per_step=guard.counts or None,
        last_loss=last_loss,
        optimizer="torch.optim.AdamW(fused=True)",
        fp8_layers=loop.fp8_layers,
    )
    ok = math.isfinite(last_loss)
    return row.model_copy(
        update={
            "status": RowStatus.OK if ok else RowStatus.FAILED,
            "measured": measured,
            "reason": None if ok else "non-finite loss",
        }
    )
