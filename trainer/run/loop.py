"""The training loop: one path for every precision, readable top to bottom.

A job is built from its spec (:mod:`trainer.components`). Each attempted step, on every rank:

1. **get the window**: the next K micro-batches (K = accumulation steps) of this rank's
   stream, on the device;
2. **accumulate and step** (:func:`trainer.run.step.train_step`): count and all-reduce the
   window's loss-bearing elements, backpropagate each micro-batch's SUM loss divided by
   that global count (times the world size: DDP averages), gradients synchronised on the
   last micro-batch only; inject test faults if the spec asks; then ``precision.step``
   unscales once, agrees on overflow across ranks, clips and steps or skips on the device,
   and the LR schedule advances by the step's ``applied`` flag (pytorch#44511);
3. **record** the step's row into the device step log (:mod:`trainer.run.telemetry`);
4. **flush** every ``log_interval`` steps, before each evaluation and checkpoint, after
   the process's first step and at the end: the pending rows are copied to the host at
   once and rank 0 writes one step record per attempted step (in between, rank 0 also
   writes records that waited ``log_interval_s``);
5. **check for divergence**: every rank's guard reads the flushed rows (all ranks see the
   same values, so they stop together) and raises a :class:`trainer.errors.DivergenceError`;
6. maybe **evaluate** (every ``eval_interval`` steps; early stopping can end the run there,
   ``keep_best`` keeps the best state: :mod:`trainer.run.early_stopping`, :mod:`trainer.run.best`)
   and maybe **checkpoint** (every ``checkpoint_interval`` steps; rank 0 writes);
7. on SIGTERM agreed by every rank: flush, checkpoint, stop (:mod:`trainer.preemption`).

No step reads a device value on the host. After the last step the end check
(:mod:`trainer.run.end_check`) fails a run that applied no update, or ended inside a long
stretch of skipped steps, before anything final is written. A divergence of an fp16 job
with ``on_divergence: "fallback_bf16"`` is caught once: the job rewinds to a healthy
checkpoint and goes on in bf16 (:mod:`trainer.run.fallback`). Then the final evaluation,
``final.pt``, an ``hf`` job's exports (:mod:`trainer.hf.export`) and the ``end`` record.

Two specs are at work: the **job spec** (``job_spec``: what the user submitted; it decides
the steps, intervals and limits, and every checkpoint stores it) and the **effective
spec** (``RunState.effective_spec``: what the run computes with; the job spec, or its bf16
copy after a precision switch).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple, TypedDict

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from halfcast.contracts.records import ExportCheck, PrecisionSwitch, StoppedEarly
from halfcast.contracts.spec import JobSpec
from trainer.batching import plan_batches, windows
from trainer.components import Components, build_components, build_record_flusher, divergence_guard
from trainer.data import Batch, Dataset
from trainer.errors import DivergenceError
from trainer.export import DATA_INFO_KEY, data_info_entry
from trainer.faults import FaultInjector
from trainer.inputs import INPUTS_KEY, input_fingerprints
from trainer.models import model_summary
from trainer.parallel.distributed import DistContext, barrier, broadcast_from_main, gather_to_main
from trainer.parallel.sharded import gather_model_state, gather_state_dicts
from trainer.preemption import StopRequested, StopSignal
from trainer.records import RECORDS_FILE, RecordSink
from trainer.rng import capture_rng_state, restore_rng_state
from trainer.run.best import best_model_state, best_path, carry_best
from trainer.run.checkpoint import (
    CheckpointExtras,
    checkpointed_model_state,
    final_path,
    restore_state,
    save_checkpoint,
    step_path,
)
from trainer.run.early_stopping import TRACKER_KEY, BestTracker, Decision
from trainer.run.end_check import check_updates_applied
from trainer.run.evaluate import evaluate
from trainer.run.fallback import Checkpoint, PrecisionFallback, RunStart
from trainer.run.flushing import RecordFlusher, RunTotals
from trainer.run.guard import DivergenceGuard
from trainer.run.resume import PRECISION_SWITCH_KEY
from trainer.run.step import record_step, train_step
from trainer.startup import StartupClock
from trainer.throughput import Rates

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunState:
    """A run in progress: what it computes with, from which step, and what it counts.

    ``effective_spec``: the job's spec, or its bf16 copy after a precision switch;
    ``window_stream``: this rank's accumulation windows from step ``done + 1`` on; ``done``:
    the attempted steps when the run started; ``precision_switch``: the switch once the job
    has switched (:mod:`trainer.run.fallback`).
    """

    effective_spec: JobSpec
    parts: Components
    guard: DivergenceGuard
    window_stream: Iterator[list[Batch]]
    done: int
    #: Samples and tokens of every attempted step so far (from the checkpoint, then counted by
    #: the run's record flusher); checkpoints carry them, so totals survive a resume.
    totals: RunTotals
    #: The best evaluation so far and the evaluations since (``keep_best``, ``early_stopping``); from the checkpoint.
    tracker: BestTracker
    precision_switch: PrecisionSwitch | None = None
    #: Fingerprints of the input files (rank 0; :mod:`trainer.inputs`), written into every checkpoint.
    inputs: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    #: The process's start-up clock (:mod:`trainer.startup`) until its first step; ``None`` after a precision switch.
    startup: StartupClock | None = None


@dataclass(frozen=True)
class StepsDone:
    """How :func:`_train_steps` ended: the last attempted step, the job's skipped steps, whether
    early stopping ended it (at ``last_step``, an evaluation step), and the whole-run throughput of
    its applied steps (:meth:`trainer.throughput.ThroughputMeter.whole_run`)."""

    last_step: int
    skipped: int
    stopped_early: bool = False
    throughput: Rates | None = None


@dataclass(frozen=True)
class TrainResult:
    """The trained (unwrapped) model, attempted and skipped steps, and the final evaluation (rank 0 only)."""

    model: nn.Module
    steps: int
    skipped_steps: int
    final_eval: dict[str, float | None] | None
    #: Attempted steps whose window held no supervised token on any rank (no update; not skipped).
    empty_windows: int = 0

    @property
    def applied_steps(self) -> int:
        """Attempted steps that applied an update (at least 1: :mod:`trainer.run.end_check`)."""
        return self.steps - self.skipped_steps - self.empty_windows


class Due(NamedTuple):
    """What follows an attempted step: a flush of its records (then the divergence check), an evaluation,
    a checkpoint."""

    flush: bool
    evaluate: bool
    checkpoint: bool


# ----------------------------------------------------------------------------- the job


def train(
    job_spec: JobSpec,
    run_dir: Path,
    dist_ctx: DistContext,
    resume_from: Path | None = None,
    stop: StopSignal | None = None,
) -> TrainResult:
    """Run the job ``job_spec`` for ``job_spec.max_steps`` attempted optimizer steps, writing into ``run_dir``.

    With ``resume_from`` (a checkpoint), training continues exactly where it stopped:
    model, optimizer, LR schedule, loss-scaler state, guard counters, every rank's RNG
    state and the data position are restored, so on CPU the continuation is
    bit-identical to an uninterrupted run.

    Rank 0 appends ``records.jsonl`` (step records in batches, see the module
    docstring) and writes ``checkpoints/``. Raises :class:`trainer.errors.TrainerError`
    (``data_unavailable``, ``spec_invalid``, ...), its :class:`trainer.errors.DivergenceError`
    (``nonfinite_gradients``, ``loss_scale_collapsed``, ``nonfinite_loss``,
    ``no_update_applied``; after the last step, before the final checkpoint and the ``end``
    record, when the run learned nothing: :mod:`trainer.run.end_check`) unless the bf16 fallback
    answers it, ``PrecisionUnsupportedError``, and ``RuntimeError`` from an injected
    ``raise_at_step`` fault; the records of the steps attempted before a failure are written
    first. With ``stop`` (SIGTERM trapped, :mod:`trainer.preemption`), once every rank has
    seen the signal the loop writes the pending records and a checkpoint of the last step,
    then raises ``StopRequested``.
    """
    fallback = PrecisionFallback(job_spec, run_dir, dist_ctx.is_main)
    with RecordSink(run_dir / RECORDS_FILE if dist_ctx.is_main else None) as records:
        startup = StartupClock.entered(records, dist_ctx.is_main)
        run = start_run(fallback.begin(resume_from), dist_ctx, run_dir, startup)
        startup.begin("first_step")
        records.start(**_start_fields(run, dist_ctx), resumed_from_step=run.done, startup=startup.times.as_record())
        while True:
            try:
                done = _train_steps(run, job_spec, run_dir, records, dist_ctx, stop)
                empty = int(run.parts.precision.empty_windows.item())
                check_updates_applied(
                    run.guard, done.last_step, done.skipped, empty
                )  # before final.pt and the end record
                break
            except DivergenceError as divergence:  # on_divergence "fallback_bf16": rewind once, go on in bf16
                restart = fallback.fall_back(divergence, run.guard, records)
                if restart is None:
                    raise
            del run  # free the fp16 components before the bf16 ones are built
            run = start_run(restart, dist_ctx, run_dir)
        last, final_eval = done.last_step, None
        if not done.stopped_early:  # an early stop ended at an evaluation of its last step
            final_eval, _ = _evaluate_step(run, job_spec, run_dir, dist_ctx, records, last)
        _checkpoint(final_path(run_dir), run, last, job_spec, dist_ctx)
        exported, export_check = _export_on_main(run, run_dir, dist_ctx, job_spec, last)
        fields = _end_fields(run, done, exported) | ({"export_check": export_check} if export_check else {})
        records.end(steps=last, skipped_steps=done.skipped, empty_windows=empty, **fields)
    log.info(
        "finished %d steps (%d skipped)%s; final evaluation %s",
        last,
        done.skipped,
        " (stopped early)" if done.stopped_early else "",
        final_eval,
    )
    return TrainResult(
        model=run.parts.model,
        steps=last,
        skipped_steps=done.skipped,
        final_eval=final_eval if dist_ctx.is_main else None,
        empty_windows=empty,
    )


class _EndFields(TypedDict, total=False):
    """The end record's fields beyond its step counts, each present only when it applies."""

    stopped_early: StoppedEarly
    samples_per_second: float
    tokens_per_second: float | None
    exported_step: int


def _end_fields(run: RunState, done: StepsDone, exported: int | None) -> _EndFields:
    """The end record's ``stopped_early`` (early stops), ``exported_step`` (jobs with exports) and whole-run
    ``samples_per_second``/``tokens_per_second`` (when measured)."""
    fields: _EndFields = {}
    if done.stopped_early:
        fields["stopped_early"] = run.tracker.stopped_early(done.last_step)
    if done.throughput is not None:
        fields["samples_per_second"] = done.throughput.samples_per_second
        fields["tokens_per_second"] = done.throughput.tokens_per_second
    if exported is not None:
        fields["exported_step"] = exported
    return fields


def start_run(
    start: RunStart, dist_ctx: DistContext, run_dir: Path | None = None, startup: StartupClock | None = None
) -> RunState:
    """Build the components of ``start.effective_spec`` and restore ``start.checkpoint`` into them, if any.

    The data stream starts at the checkpoint's step, by offset (no earlier window is built). The
    best-evaluation tracker comes back from the checkpoint too; with ``keep_best``, rank 0 carries
    the resumed checkpoint's ``best.pt`` into ``run_dir`` (:func:`trainer.run.best.carry_best`).
    With ``startup`` (the process's first run), its ``model`` phase begins once the dataset is built.
    """
    spec, checkpoint = start.effective_spec, start.checkpoint
    data_built = functools.partial(startup.begin, "model") if startup is not None else None
    parts = build_components(spec, dist_ctx, data_built=data_built)
    guard = divergence_guard(spec, parts)
    tracker = BestTracker.for_spec(spec)
    done, totals = 0, RunTotals()
    if checkpoint is not None:
        done = _restore(checkpoint, parts, guard, dist_ctx)
        totals = RunTotals.from_counters(checkpoint.payload["counters"])
        tracker.load_state_dict(checkpoint.payload.get(TRACKER_KEY))
        if spec.keep_best and run_dir is not None and dist_ctx.is_main:
            carry_best(checkpoint.path, run_dir, tracker.best_step)
    inputs = MappingProxyType(input_fingerprints(spec) if dist_ctx.is_main else {})
    return RunState(
        spec,
        parts,
        guard,
        _train_windows(parts.dataset, spec, dist_ctx, after_step=done),
        done,
        totals,
        tracker,
        start.precision_switch,
        inputs=inputs,
        startup=startup,
    )


def _train_steps(
    run: RunState,
    job_spec: JobSpec,
    run_dir: Path,
    records: RecordSink,
    dist_ctx: DistContext,
    stop: StopSignal | None,
) -> StepsDone:
    """Attempt steps ``run.done + 1`` to ``job_spec.max_steps``, or until early stopping says stop at an
    evaluation (every rank at the same step: they rank rank 0's metric); return how it ended.

    Raises what a step raises, the divergence guard's :class:`DivergenceError` included, after
    writing the pending step records, and ``StopRequested`` after the stop checkpoint.
    """
    faults = FaultInjector(job_spec.faults, dist_ctx.rank, run.effective_spec.precision)
    records.step_fields = {"precision": run.effective_spec.precision} if run.precision_switch else {}
    flusher = _record_flusher(run, records, dist_ctx)
    try:
        for step in range(run.done + 1, job_spec.max_steps + 1):
            faults.at_step_start(step)
            window = _next_window(run.window_stream, dist_ctx.device)
            result = train_step(
                run.parts, window, step=step, max_grad_norm=job_spec.max_grad_norm, dist_ctx=dist_ctx, faults=faults
            )
            record_step(flusher.step_log, step, result)
            due = _due_after(step, run, job_spec)
            if due.flush:
                rows = flusher.flush()  # write the step records,
                run.guard.observe(rows)  # then check them for divergence (every rank, the same rows)
            else:
                flusher.flush_if_stale()
            if step == run.done + 1 and run.startup is not None:
                run.startup.begin("training")
            if due.evaluate or due.checkpoint:
                flusher.pause()  # neither is training time
            stop_early = due.evaluate and _evaluate_step(run, job_spec, run_dir, dist_ctx, records, step)[1].stop
            if due.checkpoint:
                _checkpoint(step_path(run_dir, step), run, step, job_spec, dist_ctx)
            flusher.resume()
            if stop_early:
                return _stopped_early(run, step, flusher)
            if stop is not None and step < job_spec.max_steps and stop.agreed():
                _stop_after(step, run, job_spec, run_dir, flusher, dist_ctx, checkpointed=due.checkpoint)
    except BaseException:
        flusher.flush_after_failure()
        raise
    return StepsDone(job_spec.max_steps, _skipped_steps(run, flusher), throughput=flusher.meter.whole_run())


# ----------------------------------------------------------------------------- helpers


def _due_after(step: int, run: RunState, job_spec: JobSpec) -> Due:
    """Flush after the process's first step (it ends the start-up), every ``log_interval``, before evaluations
    and checkpoints and at the end; evaluate every ``eval_interval`` but at the end (the final evaluation);
    checkpoint every ``checkpoint_interval``."""
    evaluate_now = _due(step, job_spec.eval_interval) and step < job_spec.max_steps
    checkpoint_now = _due(step, job_spec.checkpoint_interval)
    first_step = step == run.done + 1 and run.startup is not None
    last_step = step == job_spec.max_steps
    flush = first_step or _due(step, job_spec.log_interval) or evaluate_now or checkpoint_now or last_step
    return Due(flush=flush, evaluate=evaluate_now, checkpoint=checkpoint_now)


def _skipped_steps(run: RunState, flusher: RecordFlusher) -> int:
    """The job's skipped steps: the last written row's count (resumed history included), else the policy's."""
    return flusher.skipped_steps if flusher.skipped_steps is not None else int(run.parts.precision.skipped_steps)


def _stopped_early(run: RunState, step: int, flusher: RecordFlusher) -> StepsDone:
    """Early stopping ended the run at ``step`` (an evaluation step)."""
    log.info(
        "early stopping at step %d: no improvement of %s in %s evaluations",
        step,
        run.tracker.metric,
        run.tracker.patience,
    )
    return StepsDone(step, _skipped_steps(run, flusher), stopped_early=True, throughput=flusher.meter.whole_run())


def _train_windows(
    dataset: Dataset, spec: JobSpec, dist_ctx: DistContext, after_step: int = 0
) -> Iterator[list[Batch]]:
    """This rank's endless stream of accumulation windows, from step ``after_step + 1`` on.

    The dataset starts its stream at micro-batch ``after_step * K`` by offset
    (:mod:`trainer.data.epochs`): a resumed run builds no window of the steps before it.
    """
    plan = plan_batches(spec)
    stream = dataset.train_batches(
        plan.micro_batch_size,
        rank=dist_ctx.rank,
        world_size=dist_ctx.world_size,
        seed=spec.seed,
        start=after_step * plan.accumulation_steps,
    )
    return windows(stream, plan.accumulation_steps)


def _next_window(window_stream: Iterator[list[Batch]], device: torch.device) -> list[Batch]:
    """The next window on ``device``; on CUDA from pinned memory, so the copies do not block the host."""
    batches = next(window_stream)
    if device.type == "cuda":
        batches = [_pinned(b) for b in batches]
    return [batch.to(device) for batch in batches]


def _pinned(batch: Batch) -> Batch:
    """``batch`` with its tensors in pinned host memory."""
    mask = None if batch.attention_mask is None else batch.attention_mask.pin_memory()
    return dataclasses.replace(
        batch, inputs=batch.inputs.pin_memory(), targets=batch.targets.pin_memory(), attention_mask=mask
    )


def _checkpoint(path: Path, run: RunState, step: int, job_spec: JobSpec, dist_ctx: DistContext) -> None:
    """Every rank contributes its RNG state (a collective); rank 0 writes the file (pending records flushed first).

    The file holds the job spec (as the user gave it); after a precision switch it also
    holds the switch, so a resume from it continues in bf16.
    """
    rng_states = gather_to_main(capture_rng_state(), dist_ctx)
    model_state, optimizer_state = gather_state_dicts(run.parts.model, run.parts.optimizer)  # a collective under FSDP2
    if dist_ctx.is_main:
        extra: CheckpointExtras = {DATA_INFO_KEY: data_info_entry(run.parts.dataset.info), INPUTS_KEY: dict(run.inputs)}
        if run.precision_switch is not None:
            extra[PRECISION_SWITCH_KEY] = run.precision_switch.body()
        extra[TRACKER_KEY] = run.tracker.state_dict()
        counters = {**run.guard.state_dict(), **run.totals.as_counters()}
        save_checkpoint(
            path,
            run.parts.training_state,
            step=step,
            counters=counters,
            spec=job_spec,
            rng=rng_states,
            model_state=model_state,
            optimizer_state=optimizer_state,
            extra=extra,
        )
        log.info("checkpoint written: %s", path)


def _restore(checkpoint: Checkpoint, parts: Components, guard: DivergenceGuard, dist_ctx: DistContext) -> int:
    """Restore a checkpoint (already checked against the spec) into ``parts`` and ``guard``; return its step.

    This rank's RNG state is restored last (building the model consumed random numbers); the
    data stream is positioned by the caller, by offset.
    """
    payload, done = checkpoint.payload, checkpoint.step
    restore_state(payload, parts.training_state)
    guard.load_state_dict(payload["counters"])
    guard.last_step = done
    restore_rng_state(payload["rng"][dist_ctx.rank])
    log.info(
        "resumed from %s at step %d in %s (loss scale %g)",
        checkpoint.path,
        done,
        parts.precision.name,
        parts.precision.loss_scale,
    )
    return done


def _record_flusher(run: RunState, records: RecordSink, dist_ctx: DistContext) -> RecordFlusher:
    """The flusher of the run's device step log (its totals continue the checkpoint's)."""
    return build_record_flusher(run.effective_spec, run.parts, records, dist_ctx, totals=run.totals)


def _stop_after(
    step: int,
    run: RunState,
    job_spec: JobSpec,
    run_dir: Path,
    flusher: RecordFlusher,
    dist_ctx: DistContext,
    *,
    checkpointed: bool,
) -> None:
    """Every rank saw SIGTERM: write the pending records (and check them), a checkpoint of ``step``, then raise
    ``StopRequested``."""
    run.guard.observe(flusher.flush())
    if not checkpointed:
        _checkpoint(step_path(run_dir, step), run, step, job_spec, dist_ctx)
    raise StopRequested(step)


def _due(step: int, interval: int | None) -> bool:
    return interval is not None and step % interval == 0


def _evaluate(parts: Components, spec: JobSpec, dist_ctx: DistContext) -> dict[str, float | None]:
    """Every rank evaluates its share of the held-out set; the sums are all-reduced (:mod:`trainer.run.evaluate`).

    A sharded (FSDP2) model needs every rank in its forward passes (parameter all-gathers),
    so then every rank evaluates the whole set.
    """
    sharded = isinstance(parts.model, FSDPModule)
    rank, world = (0, 1) if sharded else (dist_ctx.rank, dist_ctx.world_size)
    return evaluate(parts.model, parts.dataset, parts.precision, spec.micro_batch_size, rank=rank, world_size=world)


def _evaluate_step(
    run: RunState, job_spec: JobSpec, run_dir: Path, dist_ctx: DistContext, records: RecordSink, step: int
) -> tuple[dict[str, float | None], Decision]:
    """Evaluate at ``step``: rank 0 writes the eval record; every rank ranks rank 0's value of the tracked
    metric (broadcast), and with ``keep_best`` an improvement writes ``best.pt`` (a collective)."""
    metrics = _evaluate(run.parts, run.effective_spec, dist_ctx)
    if dist_ctx.is_main:
        records.eval(step, metrics)
    decision = run.tracker.update(step, _main_value(metrics.get(run.tracker.metric), dist_ctx))
    if job_spec.keep_best and decision.improved:
        _checkpoint(best_path(run_dir), run, step, job_spec, dist_ctx)
    barrier()
    return metrics, decision


def _main_value(value: float | None, dist_ctx: DistContext) -> float | None:
    """Rank 0's ``value`` on every rank (``None`` travels as NaN), so every rank takes the same decision."""
    if not dist_ctx.is_distributed:
        return value
    carrier = torch.tensor([math.nan if value is None else value], dtype=torch.float64, device=dist_ctx.device)
    shared = float(broadcast_from_main(carrier).item())
    return None if math.isnan(shared) else shared


def _export_on_main(
    run: RunState, run_dir: Path, dist_ctx: DistContext, job_spec: JobSpec, last: int
) -> tuple[int | None, ExportCheck | None]:
    """An ``hf`` job's ``export/`` directories (:mod:`trainer.hf.export`), written by rank 0 from a float32
    CPU rebuild of the trained model (from ``best.pt``'s weights with ``keep_best``), the merged model checked
    against it on held-out rows first (:mod:`trainer.hf.export_check`); the model state is gathered by every
    rank first (a collective under FSDP2). Returns the exported step (``None``: no exports) and, on rank 0,
    the export check."""
    if run.effective_spec.model.name != "hf":
        return None, None
    live = checkpointed_model_state(run.parts.model, gather_model_state(run.parts.model))
    exported, check = last, None
    if dist_ctx.is_main:
        from trainer.hf.build import rebuild_hf_model
        from trainer.hf.export import write_exports
        from trainer.hf.export_check import CHECK_ROWS
        from trainer.hf.export_dtype import export_dtype
        from trainer.hf.loading import hf_config, model_dir

        best_step = run.tracker.best_step if job_spec.keep_best else None
        exported, best = best_model_state(run_dir, best_step, last)
        model = rebuild_hf_model(
            run.effective_spec,
            run.parts.dataset.info,
            run.parts.tokenizer,
            run.parts.precision.compute_dtype,
            live if best is None else best,
            base_as_stored=True,
        )
        spec = run.effective_spec
        base_dir = model_dir(hf_config(spec))
        rows = next(iter(run.parts.dataset.eval_batches(CHECK_ROWS)), None)
        dtype = export_dtype(spec, base_dir)
        check = write_exports(model, run.parts.tokenizer, run_dir, dtype, _portable(spec, base_dir), check_rows=rows)
    barrier()
    return exported, check


def _portable(spec: JobSpec, base_dir: Path | None) -> Callable[[Path], None]:
    """What names the base in each export directory: its portable identity and fingerprint, no local path."""
    from trainer.hf.export_identity import base_identity, make_portable
    from trainer.hf.loading import hf_config, tokenizer_dir

    identity = base_identity(spec, input_fingerprints(spec).get("model"))
    local = [d for d in (base_dir, tokenizer_dir(hf_config(spec))) if d is not None]
    local += [d.resolve() for d in local]
    return lambda export: make_portable(export, identity, local)


def _start_fields(run: RunState, dist_ctx: DistContext) -> dict[str, object]:
    """The ``start`` record's fields, from the effective spec (a resumed switched job starts in bf16)."""
    spec, parts = run.effective_spec, run.parts
    plan = plan_batches(spec)
    switch = {PRECISION_SWITCH_KEY: run.precision_switch.body()} if run.precision_switch else {}
    return {
        **switch,
        "world_size": dist_ctx.world_size,
        "device": str(dist_ctx.device),
        "precision": spec.precision,
        "compute_dtype": str(parts.precision.compute_dtype).removeprefix("torch."),
        "accumulation_steps": plan.accumulation_steps,
        "micro_batch_size": plan.micro_batch_size,
        "global_batch_size": plan.global_batch_size,
        "max_steps": spec.max_steps,
        "log_interval": spec.log_interval,
        "task": str(parts.dataset.info.task),
        "num_parameters": sum(p.numel() for p in parts.parameters),
        "model": model_summary(parts.model),
        "parallelism": spec.parallelism,
        **({"compile_s": parts.compile_s} if parts.compile_s is not None else {}),
        **parts.precision.start_fields(),
        **_data_report(parts.dataset),
    }


def _data_report(dataset: Dataset) -> dict[str, object]:
    """``{"data": report}`` for a dataset that reports how it was read (file datasets), else ``{}``."""
    report = getattr(dataset, "report", None)
    return {"data": report} if report else {}
