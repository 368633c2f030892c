"""Held-out evaluation: loss over the whole held-out set, plus accuracy or perplexity.

The metrics (the fields of an ``eval`` record, docs/api.md):

* ``loss``: the SUM loss of every held-out batch divided by the count of its loss-bearing
  elements: samples (classification, regression), or target tokens that are not
  :data:`~trainer.data.base.IGNORE_INDEX` (language modelling: padding and masked prompt
  tokens count nowhere, neither in the numerator nor in the normaliser);
* ``perplexity`` (language modelling): ``exp(loss)``, ``None`` when that is not a finite
  float (a loss above :data:`MAX_EXP_LOSS`, or a non-finite loss), since records are strict JSON;
* ``accuracy`` (classification): correct argmax predictions / samples, in [0, 1].

With several ranks the held-out batches are split between them (batch ``i`` to rank
``i % world_size``) and the per-rank sums (loss, elements, correct) are summed with one
all-reduce, so the result is the same as one rank's over the whole set (never a mean of
per-rank means). A sharded (FSDP2) model needs every rank in each forward pass, so there
every rank evaluates every batch and nothing is reduced. Evaluation reads device values
on the host (it is not a training step).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import islice

import torch
from torch import nn

from trainer.data.base import Batch, Dataset, Task
from trainer.losses import model_outputs, sum_loss
from trainer.numerics.precision import PrecisionPolicy
from trainer.parallel.distributed import all_reduce_sum

#: Largest loss whose perplexity is reported (``exp(709)`` is near float64's maximum).
MAX_EXP_LOSS = 709.0


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: Dataset,
    precision: PrecisionPolicy,
    batch_size: int,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> dict[str, float | None]:
    """Evaluate the unwrapped ``model`` in eval mode, under the job's autocast (see the module docstring).

    ``rank``/``world_size``: this rank's share of the held-out batches (every rank must call
    it when ``world_size > 1``: the sums are all-reduced). The model is put back into training
    mode afterwards.
    """
    task = dataset.info.task
    device = next(model.parameters()).device
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, elements, correct
    model.eval()
    try:
        for batch in _share(dataset.eval_batches(batch_size), rank, world_size):
            totals += _batch_totals(model, batch.to(device), task, precision)
    finally:
        model.train()
    if world_size > 1:
        all_reduce_sum(totals)
    loss_sum, elements, correct = totals.tolist()
    return metrics_from_totals(task, loss_sum, int(elements), int(correct))


def metrics_from_totals(task: Task, loss_sum: float, elements: int, correct: int) -> dict[str, float | None]:
    """The eval record's metrics from summed totals: ``loss`` and ``perplexity`` or ``accuracy``."""
    loss = loss_sum / max(elements, 1)
    metrics: dict[str, float | None] = {"loss": loss}
    if task is Task.CLASSIFICATION:
        metrics["accuracy"] = correct / max(elements, 1)
    elif task is Task.LM:
        metrics["perplexity"] = perplexity(loss)
    return metrics


def perplexity(loss: float) -> float | None:
    """``exp(loss)``, or ``None`` when the loss is non-finite or above :data:`MAX_EXP_LOSS`."""
    return math.exp(loss) if math.isfinite(loss) and loss <= MAX_EXP_LOSS else None


def _share(batches: Iterator[Batch], rank: int, world_size: int) -> Iterator[Batch]:
    """Every ``world_size``-th batch from ``rank``."""
    return islice(batches, rank, None, world_size)


def _batch_totals(model: nn.Module, batch: Batch, task: Task, precision: PrecisionPolicy) -> torch.Tensor:
    """``[loss sum, loss-bearing elements, correct predictions]`` of one batch, float64 on the batch's device."""
    with precision.autocast():
        outputs = model_outputs(model, batch)
    loss = sum_loss(task, outputs, batch.targets).double()
    correct = (
        (outputs.argmax(dim=-1) == batch.targets).sum().double()
        if task is Task.CLASSIFICATION
        else torch.zeros_like(loss)
    )
    elements = torch.tensor(float(batch.num_elements), dtype=torch.float64, device=loss.device)
    return torch.stack([loss, elements, correct])
