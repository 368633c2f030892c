"""Per-task sum losses and element counts."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.data import IGNORE_INDEX, Task
from trainer.losses import correct_predictions, sum_loss


def test_classification_is_a_float32_sum() -> None:
    logits = torch.randn(4, 3).half()
    targets = torch.tensor([0, 1, 2, 1])
    loss = sum_loss(Task.CLASSIFICATION, logits, targets)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, F.cross_entropy(logits.float(), targets, reduction="sum"))


def test_regression_averages_outputs_and_sums_samples() -> None:
    outputs, targets = torch.zeros(2, 2), torch.tensor([[1.0, 3.0], [2.0, 0.0]])
    assert sum_loss(Task.REGRESSION, outputs, targets).item() == (1 + 9) / 2 + (4 + 0) / 2


def test_lm_skips_padding() -> None:
    logits = torch.randn(1, 3, 5)
    targets = torch.tensor([[1, IGNORE_INDEX, 4]])
    expected = F.cross_entropy(logits[0, [0, 2]], torch.tensor([1, 4]), reduction="sum")
    torch.testing.assert_close(sum_loss(Task.LM, logits, targets), expected)


def test_correct_predictions() -> None:
    assert correct_predictions(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1])) == 1
