"""Held-out evaluation: mean loss over the whole held-out set, plus accuracy or perplexity."""

from __future__ import annotations

import math

import torch
from torch import nn

from trainer.data.base import Dataset, Task
from trainer.losses import correct_predictions, model_outputs, sum_loss
from trainer.precision import PrecisionPolicy


@torch.no_grad()
def evaluate(model: nn.Module, dataset: Dataset, precision: PrecisionPolicy, batch_size: int) -> dict[str, float]:
    """Evaluate the unwrapped ``model`` in eval mode, under the job's autocast.

    Returns ``{"loss"}`` (mean per loss-bearing element) plus ``"accuracy"`` in [0, 1]
    for classification or ``"perplexity"`` (``exp(loss)``, per byte for LM). The model
    is put back into training mode afterwards.
    """
    task = dataset.info.task
    device = next(model.parameters()).device
    total_loss, elements, correct = 0.0, 0, 0
    model.eval()
    try:
        for batch in dataset.eval_batches(batch_size):
            batch = batch.to(device)
            with precision.autocast():
                outputs = model_outputs(model, batch)
            total_loss += sum_loss(task, outputs, batch.targets).item()
            elements += batch.num_elements
            if task is Task.CLASSIFICATION:
                correct += correct_predictions(outputs, batch.targets)
    finally:
        model.train()
    loss = total_loss / max(elements, 1)
    metrics = {"loss": loss}
    if task is Task.CLASSIFICATION:
        metrics["accuracy"] = correct / max(elements, 1)
    elif task is Task.LM:
        metrics["perplexity"] = math.exp(loss) if loss < 700.0 else math.inf
    return metrics
