"""One optimizer step: forward and backward over a window of micro-batches, then the precision step.

One optimizer step consumes a *window* of K micro-batches (K = accumulation steps)
on every rank: the loss-bearing elements of the window are counted and all-reduced,
so each micro-batch's SUM loss is divided by the global count (times the world size,
as DDP averages); gradients are synchronised on the last micro-batch only; then
``precision.step`` unscales, checks, agrees across ranks, clips and steps or skips on
the device, and the LR schedule advances by the step's ``applied`` flag. Nothing is
read on the host (see :mod:`trainer.run.loop` for the whole job).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from trainer.components import Components
from trainer.data import Batch
from trainer.faults import FaultInjector
from trainer.losses import LossFn
from trainer.numerics.overflow import is_distributed
from trainer.numerics.precision import PrecisionPolicy
from trainer.numerics.step_outcome import StepOutcome
from trainer.optim.skipping import DeviceSkipOptimizer
from trainer.parallel.distributed import DistContext, all_reduce_sum
from trainer.parallel.wrap import grad_sync
from trainer.run.telemetry import StepLog, StepMetrics


class WindowStats(NamedTuple):
    """Global totals of one window over all ranks, as 0-d device tensors (a named tuple: one per step).

    ``loss_total``: the window's loss over all ranks, divided by ``loss_count`` (a host integer)
    to give the float64 mean loss per loss-bearing element (:attr:`loss`): one process leaves the
    division to the host, which reads the step row in float64 anyway (:mod:`trainer.run.telemetry`:
    the same IEEE division, no device op); several ranks divide on the device (``loss_count`` 1).
    ``num_elements``, ``num_samples``, ``num_tokens``: int64, or python ints when one process
    trained (the batches' metadata are then the global counts, no device op needed);
    ``num_tokens`` is ``None`` for non-token data.
    """

    loss_total: Tensor
    loss_count: int
    num_elements: Tensor | int
    num_samples: Tensor | int
    num_tokens: Tensor | int | None

    @property
    def loss(self) -> Tensor:
        """0-d float64: the mean loss per loss-bearing element (device ops; the step log divides on the host)."""
        total = self.loss_total.double()
        return total / self.loss_count if self.loss_count != 1 else total


class StepResult(NamedTuple):
    """One attempted optimizer step: the window's totals, the precision's outcome, the lr used (0-d tensor)."""

    window: WindowStats
    outcome: StepOutcome
    lr: Tensor


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
    at 1 for a window without loss-bearing elements: zero gradients and a loss of 0.0,
    never NaN; :func:`train_step` then applies no update). Gradients are synchronised
    only on the last micro-batch. No host synchronisation: the counts are all-reduced
    as a device tensor and the loss stays on the device.
    """
    if dist_ctx.world_size == 1 and not is_distributed():
        return _accumulate_alone(model, micro_batches, precision, loss_fn)
    counts = _global_counts(micro_batches, dist_ctx.device)
    count = counts[0].clamp_min(1)
    normaliser = count.float()
    loss_sum = torch.zeros((), dtype=torch.float32, device=dist_ctx.device)
    last = len(micro_batches) - 1
    for index, batch in enumerate(micro_batches):
        with grad_sync(model, sync=index == last):
            with precision.autocast():
                batch_loss = loss_fn(model, batch)
                loss = batch_loss / normaliser * dist_ctx.world_size
            precision.backward(loss)
        loss_sum += batch_loss.detach().float()
    global_loss = all_reduce_sum(loss_sum).double() / count
    tokens = None if any(b.num_tokens is None for b in micro_batches) else counts[2]
    return WindowStats(global_loss, 1, num_elements=counts[0], num_samples=counts[1], num_tokens=tokens)


def _accumulate_alone(
    model: nn.Module, micro_batches: Sequence[Batch], precision: PrecisionPolicy, loss_fn: LossFn
) -> WindowStats:
    """:func:`accumulate_window` for one process: the counts are host integers, so each micro-batch's
    loss is divided by a python number (the same float32 division as by the count's tensor) and
    nothing is all-reduced; a one-micro-batch window keeps its loss without a running sum, and the
    window's mean is left to the host (``loss_count``)."""
    elements = sum(b.num_elements for b in micro_batches)
    count = max(elements, 1)
    loss_sum: Tensor | None = None
    last = len(micro_batches) - 1
    for index, batch in enumerate(micro_batches):
        with grad_sync(model, sync=index == last):
            with precision.autocast():
                batch_loss = loss_fn(model, batch)
                loss = batch_loss.float() / count if count != 1 else batch_loss.float()  # x / 1 == x
            precision.backward(loss)
        detached = batch_loss.detach().float()
        loss_sum = detached if loss_sum is None else loss_sum + detached
    assert loss_sum is not None, "a window holds at least one micro-batch"
    tokens = None if any(b.num_tokens is None for b in micro_batches) else sum(b.num_tokens or 0 for b in micro_batches)
    return WindowStats(
        loss_sum,
        count,
        num_elements=elements,
        num_samples=sum(b.num_samples for b in micro_batches),
        num_tokens=tokens,
    )


def _global_counts(micro_batches: Sequence[Batch], device: torch.device) -> Tensor:
    """``[elements, samples, tokens]`` of the window summed over all ranks: int64 ``[3]`` on ``device``.

    The local counts come from host-side batch metadata; they travel to the device
    without blocking (pinned memory on CUDA) and are all-reduced there.
    """
    local = [
        sum(b.num_elements for b in micro_batches),
        sum(b.num_samples for b in micro_batches),
        sum(b.num_tokens or 0 for b in micro_batches),
    ]
    if device.type == "cpu":
        return all_reduce_sum(torch.tensor(local, dtype=torch.int64))
    pinned = torch.tensor(local, dtype=torch.int64).pin_memory() if device.type == "cuda" else torch.tensor(local)
    return all_reduce_sum(pinned.to(device, non_blocking=True))


def _maybe_empty(micro_batches: Sequence[Batch], window: WindowStats) -> Tensor | None:
    """``window.num_elements == 0`` (0-d bool) if the window may be empty on every rank, else ``None``.

    Decided from host metadata without a sync: a rank whose own micro-batches hold a
    loss-bearing element knows the global count is positive, and skips the check's ops.
    """
    if any(b.num_elements > 0 for b in micro_batches):
        return None
    if isinstance(window.num_elements, int):  # one process: the count is known, and it is 0
        return torch.ones((), dtype=torch.bool, device=window.loss_total.device)
    return window.num_elements == 0


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

    The LR schedule advances by the step's ``applied`` flag (skipped steps leave it);
    gradients are zeroed (set to ``None``) afterwards in every case. Nothing is read
    on the host. The precision step's observers see ``step`` (the fp16 underflow sampler
    samples on its interval's multiples).
    A window without loss-bearing elements on any rank (all padding) is no update: the
    precision step skips the optimizer and holds the schedule and the loss scale
    (``no_data``); its logged loss is 0.0 and it is neither an overflow nor a skipped step.
    """
    lr = components.optimizer.param_groups[0]["lr"]  # the schedule replaces, never mutates, this tensor
    window = accumulate_window(
        components.train_model, micro_batches, components.precision, components.loss_fn, dist_ctx
    )
    if faults is not None:
        faults.after_backward(step, components.parameters)
    outcome = components.precision.step(
        components.optimizer,
        components.parameters,
        max_grad_norm,
        step=step,
        no_data=_maybe_empty(micro_batches, window),
    )
    components.lr_scheduler.step(outcome.applied)
    optimizer = components.optimizer
    if isinstance(optimizer, DeviceSkipOptimizer):
        optimizer.clear_grads()  # zero_grad(set_to_none=True) without its wrapper
    else:
        optimizer.zero_grad(set_to_none=True)
    return StepResult(window=window, outcome=outcome, lr=lr)


def record_step(step_log: StepLog, step: int, result: StepResult) -> None:
    """Write ``result`` into the next row of ``step_log`` as :class:`trainer.run.telemetry.StepMetrics` (device ops only)."""
    window, outcome = result.window, result.outcome
    tokens = window.num_tokens
    metrics = StepMetrics(
        window.loss_total,
        outcome.loss_scale,
        outcome.overflow,
        outcome.skipped_steps,
        outcome.grad_norm,
        result.lr,
        outcome.underflow_fraction,
        window.num_samples,
        window.num_samples if tokens is None else tokens,
    )
    evidence = _evidence(step_log, outcome)
    step_log.record(step, metrics, has_tokens=tokens is not None, evidence=evidence, loss_count=window.loss_count)


def _evidence(step_log: StepLog, outcome: StepOutcome) -> tuple[Tensor, ...]:
    """The step's overflow evidence in ``step_log``'s layout (:attr:`trainer.run.telemetry.StepLog.evidence_widths`).

    Raises:
        ValueError: a log laid out for one process given a step agreed across ranks, or the reverse.
    """
    if not step_log.evidence_widths:
        return ()
    if (outcome.agreed_rank_kinds is None) != step_log.one_process:
        raise ValueError(f"a step log for {step_log.num_ranks} rank(s) got a step of another world size")
    if outcome.agreed_rank_kinds is None:
        return (outcome.param_evidence,)
    return (outcome.agreed_rank_kinds, outcome.param_evidence)
