"""The training loop: one path for every precision, readable top to bottom.

One optimizer step consumes a *window* of K micro-batches (K = accumulation steps)
on every rank:

1. count the loss-bearing elements of the window (samples, or valid tokens) and
   all-reduce the count, so the normaliser is the global count of the window;
2. per micro-batch, under the precision's autocast, compute the SUM loss, divide it
   by the global count and multiply by the world size (DDP averages gradients over
   ranks), and call ``precision.backward``; every micro-batch but the last runs in
   DDP's ``no_sync()``, so gradients are all-reduced once per window. The
   accumulated gradient is then exactly the gradient of the mean loss over every
   element of the window on every rank, however unequal the micro-batches
   (huggingface/transformers#34263);
3. inject test faults, if the spec asks;
4. ``precision.step``: unscale once, check for non-finite gradients on every rank,
   clip the unscaled gradients, step or skip;
5. advance the LR schedule only if the optimizer stepped (pytorch#44511);
6. zero the gradients;
7. rank 0 writes the step record.

Rank 0 evaluates every ``eval_interval`` steps and at the end, and writes checkpoints.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from trainer.batching import plan_batches, windows
from trainer.checkpoint import TrainingState, final_path, load_checkpoint, restore_state, save_checkpoint, step_path
from trainer.data import Batch, Dataset, build_dataset
from trainer.distributed import DistContext, all_reduce_sum, barrier, gather_to_main
from trainer.evaluate import evaluate
from trainer.faults import FaultInjector
from trainer.guard import DivergenceGuard
from trainer.losses import LossFn, task_loss
from trainer.models import build_model
from trainer.optim import build_lr_scheduler, build_optimizer
from trainer.parallel import grad_sync, wrap_model
from trainer.precision import PrecisionPolicy, StepOutcome, build_precision
from trainer.records import RECORDS_FILE, RecordSink, StepRecord
from trainer.resume import check_resumable
from trainer.rng import capture_rng_state, restore_rng_state
from trainer.spec import JobSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WindowStats:
    """Global totals of one window over all ranks; ``loss`` is the mean per loss-bearing element."""

    loss: float
    num_elements: int
    num_samples: int
    num_tokens: int | None


@dataclass(frozen=True)
class StepResult:
    """One attempted optimizer step: the window's totals, the precision's outcome, the lr used."""

    window: WindowStats
    outcome: StepOutcome
    lr: float


@dataclass(frozen=True)
class Components:
    """Everything :func:`train` builds from a spec; ``model`` is unwrapped, ``train_model`` maybe DDP."""

    dataset: Dataset
    model: nn.Module
    train_model: nn.Module
    precision: PrecisionPolicy
    optimizer: torch.optim.Optimizer
    lr_scheduler: LRScheduler
    loss_fn: LossFn

    @property
    def parameters(self) -> list[torch.Tensor]:
        """The trainable parameters, in model order."""
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def training_state(self) -> TrainingState:
        """What a checkpoint captures."""
        return TrainingState(self.model, self.optimizer, self.lr_scheduler, self.precision)


@dataclass(frozen=True)
class TrainResult:
    """The trained (unwrapped) model, attempted and skipped steps, and the final evaluation (rank 0 only)."""

    model: nn.Module
    steps: int
    skipped_steps: int
    final_eval: dict[str, float] | None


# ----------------------------------------------------------------------------- one step


def accumulate_window(
    model: nn.Module,
    micro_batches: Sequence[Batch],
    precision: PrecisionPolicy,
    loss_fn: LossFn,
    dist_ctx: DistContext,
) -> WindowStats:
    """Forward and backward over the micro-batches of one window, leaving the summed gradient in ``.grad``.

    Each micro-batch contributes ``loss_fn(model, batch) / global_count * world_size``,
    so after DDP's averaging the gradient equals that of the mean loss over all
    ``global_count`` elements of the window on all ranks (``global_count`` is floored
    at 1 for a window without loss-bearing elements). Gradients are synchronised
    only on the last micro-batch. Makes two host synchronisations (the count and
    the loss sum).
    """
    totals = _global_counts(micro_batches, dist_ctx.device)
    normaliser = max(totals[0], 1)
    loss_sum = torch.zeros((), dtype=torch.float32, device=dist_ctx.device)
    last = len(micro_batches) - 1
    for index, batch in enumerate(micro_batches):
        with grad_sync(model, sync=index == last):
            with precision.autocast():
                batch_loss = loss_fn(model, batch)
                loss = batch_loss / normaliser * dist_ctx.world_size
            precision.backward(loss)
        loss_sum += batch_loss.detach().float()
    global_loss = all_reduce_sum(loss_sum).item()
    tokens = None if any(b.num_tokens is None for b in micro_batches) else totals[2]
    return WindowStats(
        loss=global_loss / normaliser, num_elements=totals[0], num_samples=totals[1], num_tokens=tokens
    )


def _global_counts(micro_batches: Sequence[Batch], device: torch.device) -> list[int]:
    """``[elements, samples, tokens]`` of the window summed over all ranks."""
    local = [
        sum(b.num_elements for b in micro_batches),
        sum(b.num_samples for b in micro_batches),
        sum(b.num_tokens or 0 for b in micro_batches),
    ]
    counts = torch.tensor(local, dtype=torch.int64, device=device)
    return [int(value) for value in all_reduce_sum(counts).tolist()]


def train_step(
    components: Components,
    micro_batches: Sequence[Batch],
    *,
    step: int,
    max_grad_norm: float | None,
    dist_ctx: DistContext,
    faults: FaultInjector | None = None,
) -> StepResult:
    """Attempt optimizer step ``step`` (1-based) on one window of micro-batches (already on the device).

    The LR schedule advances only when the optimizer stepped; gradients are zeroed
    (set to ``None``) afterwards in every case.
    """
    lr = float(components.optimizer.param_groups[0]["lr"])
    window = accumulate_window(
        components.train_model, micro_batches, components.precision, components.loss_fn, dist_ctx
    )
    if faults is not None:
        faults.after_backward(step, components.parameters)
    outcome = components.precision.step(components.optimizer, components.parameters, max_grad_norm)
    if outcome.applied:
        components.lr_scheduler.step()
    components.optimizer.zero_grad(set_to_none=True)
    return StepResult(window=window, outcome=outcome, lr=lr)


# ----------------------------------------------------------------------------- the job


def seed_everything(seed: int) -> None:
    """Seed Python's and torch's generators (CPU and every CUDA device)."""
    random.seed(seed)
    torch.manual_seed(seed)


def build_components(spec: JobSpec, dist_ctx: DistContext) -> Components:
    """Precision, dataset, model (seeded by ``spec.seed``, identical on every rank), optimizer, schedule.

    Raises ``PrecisionUnsupportedError`` before anything else is built, then
    :class:`trainer.errors.TrainerError` for unavailable data or a model that cannot
    be built.
    """
    precision = build_precision(spec, dist_ctx.device)
    dataset = build_dataset(spec.dataset)
    seed_everything(spec.seed)
    model = build_model(spec.model, dataset.info).to(dist_ctx.device)
    model = precision.prepare_model(model)
    optimizer = build_optimizer(spec.optimizer, (p for p in model.parameters() if p.requires_grad))
    return Components(
        dataset=dataset,
        model=model,
        train_model=wrap_model(model, dist_ctx),
        precision=precision,
        optimizer=optimizer,
        lr_scheduler=build_lr_scheduler(spec.lr_scheduler, optimizer, spec.max_steps),
        loss_fn=task_loss(dataset.info.task),
    )


def train(spec: JobSpec, run_dir: Path, dist_ctx: DistContext, resume_from: Path | None = None) -> TrainResult:
    """Run the job ``spec`` for ``spec.max_steps`` attempted optimizer steps, writing into ``run_dir``.

    With ``resume_from`` (a checkpoint), training continues exactly where it stopped:
    model, optimizer, LR schedule, loss-scaler state, guard counters, every rank's RNG
    state and the data position are restored, so on CPU the continuation is
    bit-identical to an uninterrupted run.

    Rank 0 appends ``records.jsonl`` and writes ``checkpoints/``. Raises
    :class:`trainer.errors.TrainerError` (``nonfinite_gradients``, ``nonfinite_loss``,
    ``data_unavailable``, ``spec_invalid``), ``PrecisionUnsupportedError``, and
    ``RuntimeError`` from an injected ``raise_at_step`` fault.
    """
    parts = build_components(spec, dist_ctx)
    faults = FaultInjector(spec.faults, dist_ctx.rank)
    guard = DivergenceGuard(spec.max_consecutive_skips, spec.max_consecutive_nonfinite_losses)
    window_stream = _train_windows(parts.dataset, spec, dist_ctx)
    done = 0 if resume_from is None else _resume(resume_from, spec, parts, guard, window_stream, dist_ctx)
    main = dist_ctx.is_main
    with RecordSink(run_dir / RECORDS_FILE if main else None) as records:
        records.start(**_start_fields(spec, parts, dist_ctx), resumed_from_step=done)
        skipped = parts.precision.skipped_steps
        for step in range(done + 1, spec.max_steps + 1):
            faults.at_step_start(step)
            started = time.perf_counter()
            micro_batches = _next_window(window_stream, dist_ctx.device)
            result = train_step(
                parts, micro_batches, step=step, max_grad_norm=spec.max_grad_norm, dist_ctx=dist_ctx, faults=faults
            )
            records.step(_step_record(step, result, time.perf_counter() - started))
            skipped = result.outcome.skipped_steps
            _log_progress(step, spec.max_steps, result, main)
            guard.update(step, result.outcome.overflow, result.window.loss)
            if _due(step, spec.eval_interval) and step < spec.max_steps:
                _evaluate_on_main(parts, spec, dist_ctx, records, step)
            if _due(step, spec.checkpoint_interval):
                _checkpoint(step_path(run_dir, step), parts, step, guard, spec, dist_ctx)
        final_eval = _evaluate_on_main(parts, spec, dist_ctx, records, spec.max_steps)
        _checkpoint(final_path(run_dir), parts, spec.max_steps, guard, spec, dist_ctx)
        records.end(steps=spec.max_steps, skipped_steps=skipped)
    log.info("finished %d steps (%d skipped); final evaluation %s", spec.max_steps, skipped, final_eval)
    return TrainResult(model=parts.model, steps=spec.max_steps, skipped_steps=skipped, final_eval=final_eval)


# ----------------------------------------------------------------------------- helpers

def _train_windows(dataset: Dataset, spec: JobSpec, dist_ctx: DistContext) -> Iterator[list[Batch]]:
    """This rank's endless stream of accumulation windows."""
    plan = plan_batches(spec)
    stream = dataset.train_batches(
        plan.micro_batch_size, rank=dist_ctx.rank, world_size=dist_ctx.world_size, seed=spec.seed
    )
    return windows(stream, plan.accumulation_steps)


def _next_window(window_stream: Iterator[list[Batch]], device: torch.device) -> list[Batch]:
    return [batch.to(device) for batch in next(window_stream)]


def _checkpoint(
    path: Path, parts: Components, step: int, guard: DivergenceGuard, spec: JobSpec, dist_ctx: DistContext
) -> None:
    """Every rank contributes its RNG state (a collective); rank 0 writes the file."""
    rng_states = gather_to_main(capture_rng_state(), dist_ctx)
    if dist_ctx.is_main:
        save_checkpoint(
            path, parts.training_state, step=step, counters=guard.state_dict(), spec=spec, rng=rng_states
        )
        log.info("checkpoint written: %s", path)


def _resume(
    path: Path,
    spec: JobSpec,
    parts: Components,
    guard: DivergenceGuard,
    window_stream: Iterator[list[Batch]],
    dist_ctx: DistContext,
) -> int:
    """Restore a checkpoint into ``parts`` and ``guard``; return the attempted steps it had done.

    The data stream is advanced past the windows already consumed, and this rank's
    RNG state is restored last (building the model consumed random numbers).
    """
    payload = load_checkpoint(path)
    done = check_resumable(payload, spec, path)
    restore_state(payload, parts.training_state)
    guard.load_state_dict(payload["counters"])
    for _ in range(done):
        next(window_stream)
    restore_rng_state(payload["rng"][dist_ctx.rank])
    log.info("resumed from %s at step %d (loss scale %g)", path, done, parts.precision.loss_scale)
    return done


def _due(step: int, interval: int | None) -> bool:
    return interval is not None and step % interval == 0


def _evaluate_on_main(
    parts: Components, spec: JobSpec, dist_ctx: DistContext, records: RecordSink, step: int
) -> dict[str, float] | None:
    """Rank 0 evaluates the unwrapped model and writes the eval record; the other ranks wait."""
    metrics = None
    if dist_ctx.is_main:
        metrics = evaluate(parts.model, parts.dataset, parts.precision, spec.micro_batch_size)
        records.eval(step, metrics)
    barrier()
    return metrics


def _step_record(step: int, result: StepResult, seconds: float) -> StepRecord:
    window, outcome = result.window, result.outcome
    seconds = max(seconds, 1e-9)
    return StepRecord(
        step=step,
        loss=window.loss,
        loss_scale=outcome.loss_scale,
        overflow=outcome.overflow,
        skipped_steps=outcome.skipped_steps,
        grad_norm=outcome.grad_norm,
        lr=result.lr,
        samples_per_second=window.num_samples / seconds,
        tokens_per_second=None if window.num_tokens is None else window.num_tokens / seconds,
    )


def _start_fields(spec: JobSpec, parts: Components, dist_ctx: DistContext) -> dict[str, object]:
    plan = plan_batches(spec)
    return {
        "world_size": dist_ctx.world_size,
        "device": str(dist_ctx.device),
        "precision": spec.precision,
        "compute_dtype": str(parts.precision.compute_dtype).removeprefix("torch."),
        "accumulation_steps": plan.accumulation_steps,
        "micro_batch_size": plan.micro_batch_size,
        "global_batch_size": plan.global_batch_size,
        "max_steps": spec.max_steps,
        "task": str(parts.dataset.info.task),
        "num_parameters": sum(p.numel() for p in parts.parameters),
    }


def _log_progress(step: int, max_steps: int, result: StepResult, main: bool) -> None:
    if not main:
        return
    if step == 1 or step == max_steps or step % max(1, max_steps // 10) == 0 or result.outcome.overflow:
        outcome = result.outcome
        log.info(
            "step %d/%d loss %.4g scale %g overflow %s skipped %d grad_norm %s lr %.3g",
            step, max_steps, result.window.loss, outcome.loss_scale, outcome.overflow,
            outcome.skipped_steps, outcome.grad_norm, result.lr,
        )
