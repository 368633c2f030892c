"""What a job is built from: precision, dataset, model, optimizer, LR schedule, guard, record flusher."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from halfcast.contracts.spec import JobSpec
from trainer.data import Batch, Dataset, build_dataset
from trainer.losses import LossFn, task_loss
from trainer.model_compile import compile_model, warm_up
from trainer.models import build_job_model
from trainer.numerics.loss_scale import DynamicLossScaler
from trainer.numerics.precision import PrecisionPolicy, build_precision
from trainer.optim.build import build_lr_scheduler, build_optimizer
from trainer.optim.schedule import DeviceLRSchedule
from trainer.parallel.distributed import DistContext
from trainer.parallel.wrap import wrap_model
from trainer.records import RecordSink
from trainer.rng import seed_everything
from trainer.run.checkpoint import TrainingState
from trainer.run.flushing import RecordFlusher, RunTotals
from trainer.run.guard import DivergenceGuard
from trainer.run.telemetry import StepLog


@dataclass(frozen=True)
class Components:
    """Everything :func:`train` builds from a spec; ``model`` is unwrapped, ``train_model`` maybe DDP."""

    dataset: Dataset
    model: nn.Module
    train_model: nn.Module
    precision: PrecisionPolicy
    optimizer: torch.optim.Optimizer
    lr_scheduler: DeviceLRSchedule
    loss_fn: LossFn
    #: The job's Hugging Face tokenizer (``hf`` models on tokenized data), else ``None``.
    tokenizer: Any | None = None
    #: Seconds ``torch.compile`` took before the first step (``compile: true``), else ``None``.
    compile_s: float | None = None

    @functools.cached_property
    def parameters(self) -> list[torch.Tensor]:
        """The trainable parameters, in model order (listed once: a job never changes which train)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def training_state(self) -> TrainingState:
        """What a checkpoint captures."""
        return TrainingState(self.model, self.optimizer, self.lr_scheduler, self.precision)


def build_components(
    spec: JobSpec, dist_ctx: DistContext, data_built: Callable[[], object] | None = None
) -> Components:
    """Precision, dataset, model (seeded by ``spec.seed``, identical on every rank), optimizer, schedule.

    The optimizer is built after wrapping (FSDP2 replaces the parameters by sharded
    ones). Raises ``PrecisionUnsupportedError`` before anything else is built, then
    :class:`trainer.errors.TrainerError` for unavailable data or a model that cannot
    be built. ``data_built`` is called once the dataset is (the start-up clock's
    ``model`` phase begins there, :mod:`trainer.startup`).
    """
    precision = build_precision(spec, dist_ctx.device)
    tokenizer = job_tokenizer(spec)
    dataset = build_dataset(spec.dataset, tokenizer=tokenizer)
    if data_built is not None:
        data_built()
    seed_everything(spec.seed)
    model = build_job_model(spec, dataset.info, tokenizer, precision.compute_dtype).to(dist_ctx.device)
    model = precision.prepare_model(model)
    train_model = wrap_model(model, dist_ctx, spec.parallelism, spec.precision)
    optimizer = build_optimizer(spec.optimizer, (p for p in model.parameters() if p.requires_grad))
    loss_fn = task_loss(dataset.info.task)
    compile_s = None
    if spec.compile:
        train_model = compile_model(train_model)
        if (
            dist_ctx.device.type == "cuda"
        ):  # on a CPU the compiled check costs more than it saves (trainer.compiled_clip)
            precision.compile_step()
        compile_s = warm_up(train_model, _first_batch(dataset, spec, dist_ctx), precision, loss_fn)
    return Components(
        dataset=dataset,
        model=model,
        train_model=train_model,
        precision=precision,
        optimizer=optimizer,
        lr_scheduler=build_lr_scheduler(spec.lr_scheduler, optimizer, spec.max_steps),
        loss_fn=loss_fn,
        tokenizer=tokenizer,
        compile_s=compile_s,
    )


def _first_batch(dataset: Dataset, spec: JobSpec, dist_ctx: DistContext) -> Batch:
    """This rank's first training micro-batch, on its device (from a stream of its own: the job's is untouched)."""
    stream = dataset.train_batches(
        spec.micro_batch_size, rank=dist_ctx.rank, world_size=dist_ctx.world_size, seed=spec.seed
    )
    return next(iter(stream)).to(dist_ctx.device)


def job_tokenizer(spec: JobSpec) -> Any | None:
    """The tokenizer of an ``hf`` model spec (loaded before the dataset, which tokenizes with it), else ``None``."""
    if spec.model.name != "hf":
        return None
    from trainer.hf.loading import load_tokenizer

    return load_tokenizer(spec.model.config, spec.dataset.name)


def divergence_guard(spec: JobSpec, parts: Components) -> DivergenceGuard:
    """The guard of ``spec``'s limits; it knows ``min_scale`` only with a dynamic loss scaler."""
    scaler = parts.precision.scaler
    return DivergenceGuard(
        spec.max_consecutive_skips,
        spec.max_consecutive_nonfinite_losses,
        min_scale=scaler.min_scale if isinstance(scaler, DynamicLossScaler) else None,
    )


def build_record_flusher(
    spec: JobSpec, parts: Components, records: RecordSink, dist_ctx: DistContext, totals: RunTotals | None = None
) -> RecordFlusher:
    """The record flusher a job's loop uses: a ``log_interval``-row device step log that keeps the
    overflow evidence of every rank and parameter, flushed by time on rank 0 (``log_interval_s``)."""
    names = [name for name, p in parts.model.named_parameters() if p.requires_grad]
    readable = getattr(parts.model, "readable_names", None)  # hf: without the wrapper's and PEFT's prefixes
    names = readable(names) if callable(readable) else names
    step_log = StepLog(spec.log_interval, dist_ctx.device, num_ranks=dist_ctx.world_size, num_params=len(names))
    return RecordFlusher(
        step_log,
        records,
        spec.max_steps,
        dist_ctx.is_main,
        param_names=names,
        max_latency_s=spec.log_interval_s,
        totals=totals,
    )
