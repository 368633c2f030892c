"""Held-out metrics: LM loss over unmasked tokens only, perplexity, classification accuracy, and 2-rank sums."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from trainer_support import lm_micro_batch, spawn_ranks, tiny_lm

from halfcast.contracts.spec import JobSpec
from trainer.data.base import IGNORE_INDEX, Batch, DataInfo, Task, feature_batch, token_batch
from trainer.numerics.precision import PrecisionPolicy, build_precision
from trainer.parallel.distributed import DistContext
from trainer.run.evaluate import MAX_EXP_LOSS, evaluate, perplexity

MLP_SPEC = {"model": {"name": "mlp", "config": {"hidden_sizes": [4]}}, "dataset": {"name": "synthetic"}}


class HeldOut:
    """A dataset whose held-out set is the given batches (training is not used)."""

    def __init__(self, info: DataInfo, batches: list[Batch]) -> None:
        self.info, self.batches = info, batches

    def train_batches(
        self, micro_batch_size: int, *, rank: int, world_size: int, seed: int, start: int = 0
    ) -> Iterator[Batch]:
        raise NotImplementedError

    def eval_batches(self, batch_size: int) -> Iterator[Batch]:
        return iter(self.batches)


def _fp32() -> PrecisionPolicy:
    return build_precision(JobSpec.model_validate(MLP_SPEC), torch.device("cpu"))


def _lm_batches() -> list[Batch]:
    """Three batches with masked prompt tokens (leading targets) and right padding (trailing targets)."""
    batches = []
    for seed, (prompt, valid) in enumerate([(3, 12), (0, 5), (6, 16)]):
        batch = lm_micro_batch(valid=valid, seed=seed)
        targets = batch.targets.clone()
        targets[:, :prompt] = IGNORE_INDEX  # a masked prompt
        batches.append(token_batch(batch.inputs, targets))
    return batches


def _hand_lm_loss(model: nn.Module, batches: list[Batch]) -> float:
    """Mean next-token cross-entropy over the targets that are not IGNORE_INDEX, one token at a time."""
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            logits = model(batch.inputs)
            for row, col in (batch.targets != IGNORE_INDEX).nonzero().tolist():
                target = batch.targets[row, col]
                total += float(-F.log_softmax(logits[row, col].double(), dim=-1)[target])
                count += 1
    return total / count


def test_lm_eval_loss_is_the_mean_over_unmasked_tokens_only() -> None:
    model, batches = tiny_lm(), _lm_batches()
    assert all((b.targets == IGNORE_INDEX).any() for b in batches)
    metrics = evaluate(model, HeldOut(DataInfo(Task.LM, 32, seq_len=8), batches), _fp32(), 2)
    assert metrics["loss"] == pytest.approx(_hand_lm_loss(model, batches), rel=1e-6)
    assert "accuracy" not in metrics


def test_perplexity_is_exp_of_the_loss_and_null_when_huge() -> None:
    model, batches = tiny_lm(), _lm_batches()
    metrics = evaluate(model, HeldOut(DataInfo(Task.LM, 32, seq_len=8), batches), _fp32(), 2)
    loss = metrics["loss"]
    assert loss is not None and metrics["perplexity"] == pytest.approx(math.exp(loss), rel=1e-12)
    assert perplexity(MAX_EXP_LOSS + 1) is None and perplexity(math.inf) is None and perplexity(math.nan) is None
    assert perplexity(2.0) == math.exp(2.0)


class Fixed(nn.Module):
    """Logits given by a lookup: sample i (its first input feature) gets row i of ``logits``."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(logits)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.logits[inputs[:, 0].long()]


def _classification() -> tuple[Fixed, HeldOut]:
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(10, 3, generator=generator)
    targets = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    ids = torch.arange(10, dtype=torch.float32).unsqueeze(1)
    batches = [feature_batch(ids[i : i + 4], targets[i : i + 4]) for i in range(0, 10, 4)]  # 4 + 4 + 2
    return Fixed(logits), HeldOut(DataInfo(Task.CLASSIFICATION, 3, in_features=1), batches)


def test_classification_accuracy_is_exact_on_a_seeded_case() -> None:
    model, data = _classification()
    metrics = evaluate(model, data, _fp32(), 4)
    targets = torch.cat([b.targets for b in data.batches])
    expected = int((model.logits.argmax(-1) == targets).sum()) / 10
    assert metrics["accuracy"] == expected
    assert 0 < expected < 1  # the case tells right from wrong
    assert metrics["loss"] == pytest.approx(float(F.cross_entropy(model.logits.detach().double(), targets)), rel=1e-6)
    assert "perplexity" not in metrics


def _rank(ctx: DistContext, out: str) -> None:
    rank = ctx.rank
    lm = evaluate(
        tiny_lm(),
        HeldOut(DataInfo(Task.LM, 32, seq_len=8), _lm_batches()),
        _fp32(),
        2,
        rank=ctx.rank,
        world_size=ctx.world_size,
    )
    model, data = _classification()
    cls = evaluate(model, data, _fp32(), 4, rank=ctx.rank, world_size=ctx.world_size)
    torch.save({"lm": lm, "cls": cls}, Path(out) / f"rank{rank}.pt")


@pytest.mark.slow
def test_two_rank_eval_equals_the_one_rank_eval(tmp_path: Path) -> None:
    spawn_ranks(_rank, str(tmp_path))
    one_lm = evaluate(tiny_lm(), HeldOut(DataInfo(Task.LM, 32, seq_len=8), _lm_batches()), _fp32(), 2)
    model, data = _classification()
    one_cls = evaluate(model, data, _fp32(), 4)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["lm"].keys() == one_lm.keys() and got["cls"].keys() == one_cls.keys()
        assert got["lm"]["loss"] == pytest.approx(one_lm["loss"], rel=1e-12)
        assert got["lm"]["perplexity"] == pytest.approx(one_lm["perplexity"], rel=1e-12)
        assert got["cls"]["accuracy"] == one_cls["accuracy"]
        assert got["cls"]["loss"] == pytest.approx(one_cls["loss"], rel=1e-12)
