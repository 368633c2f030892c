"""Per-task SUM losses; the loop divides by the global count of loss-bearing elements.

Summing (instead of averaging per micro-batch) is what makes gradient accumulation
over unequal micro-batches and ranks equal to the full-batch mean gradient
(huggingface/transformers#34263). Outputs are cast to float32 before the loss, so the
reduction never runs in fp16 or bf16.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from trainer.data.base import IGNORE_INDEX, Batch, Task

#: ``loss_fn(model, batch)`` -> float32 scalar: the SUM of the per-element losses of ``batch``.
LossFn = Callable[[nn.Module, Batch], torch.Tensor]


def sum_loss(task: Task, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum over loss-bearing elements, float32 scalar.

    classification: cross-entropy of logits ``[B, C]`` against int64 ``[B]``;
    regression: squared error of ``[B, D]`` against ``[B, D]``, averaged over ``D``
    (one element per sample; for ``D == 1`` the usual MSE numerator);
    lm: next-token cross-entropy of logits ``[B, T, V]`` against int64 ``[B, T]``,
    skipping targets equal to :data:`IGNORE_INDEX`.
    """
    outputs = outputs.float()
    if task is Task.CLASSIFICATION:
        return F.cross_entropy(outputs, targets, reduction="sum")
    if task is Task.REGRESSION:
        return F.mse_loss(outputs, targets.float(), reduction="sum") / outputs.shape[-1]
    flat = outputs.reshape(-1, outputs.shape[-1])
    return F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")


def model_outputs(model: nn.Module, batch: Batch) -> torch.Tensor:
    """``model(batch.inputs)``, or ``model(batch.inputs, batch.attention_mask)`` when the batch has a mask."""
    if batch.attention_mask is None:
        return model(batch.inputs)
    return model(batch.inputs, batch.attention_mask)


def task_loss(task: Task) -> LossFn:
    """The :data:`LossFn` that runs :func:`model_outputs` and sums :func:`sum_loss`."""

    def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
        return sum_loss(task, model_outputs(model, batch), batch.targets)

    return loss_fn


@torch.no_grad()
def correct_predictions(outputs: torch.Tensor, targets: torch.Tensor) -> int:
    """Count of rows of logits ``[B, C]`` whose argmax equals the int64 target ``[B]``."""
    return int((outputs.argmax(dim=-1) == targets).sum().item())
