"""Halfcast's path: ``build_components`` on the job spec, then :func:`trainer.run.step.train_step` per step.

The step and its telemetry row run inside the strict sync guard; the log's drain (the loop's
one intended copy, every ``log_interval`` steps) runs outside it, inside the timed span.
"""

from __future__ import annotations

import math

from pydantic import ValidationError

from bench.gpu.flops import count_flops, mfu
from bench.gpu.results import Measurement, PathResult, RowStatus
from bench.gpu.settings import CheckPrecision, CheckSettings, ModelKind, PathKind
from bench.gpu.steady import timed_steady_steps
from bench.gpu.syncs import SyncGuard
from bench.gpu.workloads import attention_shape, job_spec, preload
from trainer.components import Components, build_components
from trainer.numerics.precision import PrecisionUnsupportedError
from trainer.optim.build import resolve_implementation
from trainer.parallel.distributed import DistContext
from trainer.run.step import record_step, train_step
from trainer.run.telemetry import StepLog, StepRow


def run_halfcast(model: ModelKind, precision: CheckPrecision, settings: CheckSettings, ctx: DistContext) -> PathResult:
    """Build, warm up, check and time Halfcast's steady steps of ``model`` in ``precision`` on this rank."""
    row = PathResult(
        model=model,
        precision=precision,
        path=PathKind.HALFCAST,
        status=RowStatus.SKIPPED,
        rank=ctx.rank,
        world_size=ctx.world_size,
    )
    try:
        spec = job_spec(model, precision, settings, ctx.world_size)
        parts = build_components(spec, ctx)
    except PrecisionUnsupportedError as exc:
        return row.model_copy(update={"reason": str(exc)})
    except ValidationError as exc:  # the spec refuses fp8 without a GPU (dry run)
        return row.model_copy(update={"reason": exc.errors()[0]["msg"]})
    batches = preload(spec, ctx.device, ctx.rank, ctx.world_size)
    step_log = StepLog(settings.counts.log_interval, ctx.device)
    rows: list[StepRow] = []

    def step(n: int) -> None:
        result = train_step(parts, [batches[n % len(batches)]], step=n, max_grad_norm=1.0, dist_ctx=ctx)
        record_step(step_log, n, result)

    def after(n: int) -> None:
        if step_log.full:
            rows.extend(step_log.drain())

    guard = SyncGuard(ctx.device, strict=True)
    counts = settings.counts
    seconds = timed_steady_steps(step, counts.warmup, counts.steps, guard, ctx.device, after)
    rows.extend(step_log.drain())
    measured = _measurement(model, settings, parts, spec.micro_batch_size, seconds, guard, rows[-1].loss)
    ok = math.isfinite(measured.last_loss) and guard.clean
    return row.model_copy(
        update={
            "status": RowStatus.OK if ok else RowStatus.FAILED,
            "measured": measured,
            "reason": None if ok else "a sync or a non-finite loss in a steady step",
        }
    )


def _measurement(
    model: ModelKind,
    settings: CheckSettings,
    parts: Components,
    batch: int,
    seconds: float,
    guard: SyncGuard,
    last_loss: float,
) -> Measurement:
    counts = settings.counts
    n_layer, seq_len, d_model = attention_shape(model, settings)
    flops = count_flops(parts.model, n_layer, seq_len, d_model)
    tokens_per_s = counts.steps * batch * seq_len / seconds
    # parts.parameters holds Parameters typed as Tensor (trainer.optim.build asks for Parameter)
    implementation = resolve_implementation(settings.implementation, parts.parameters)  # type: ignore[arg-type]
    return Measurement(
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
        optimizer=f"AdamW({implementation})",
        fp8_layers=len(parts.precision.fp8_layers),
        skipped_steps=int(parts.precision.skipped_steps.item()),
    )
