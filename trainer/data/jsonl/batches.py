"""Tokenized file datasets as the loop sees them: rank-sharded, right-padded micro-batches.

A sample is one example's int64 ``inputs [T]`` and ``targets`` (``[T]`` shifted
token labels with :data:`IGNORE_INDEX` where masked, or a 0-d class id). A
micro-batch pads its samples on the right to its own longest one (not to
``max_seq_len``): ``inputs`` with the pad id, language-modelling ``targets`` with
:data:`IGNORE_INDEX`, ``attention_mask`` with 0.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from halfcast.contracts.status import FailureReason
from trainer.data.base import IGNORE_INDEX, Batch, DataInfo, Task, epoch_generator
from trainer.data.epochs import batches_per_rank, sharded_epochs
from trainer.errors import TrainerError


@dataclass(frozen=True)
class Sample:
    """One example: int64 ``inputs [T]`` and ``targets`` (``[T]`` for LM, 0-d for classification)."""

    inputs: torch.Tensor
    targets: torch.Tensor


def collate(samples: Sequence[Sample], pad_id: int, task: Task) -> Batch:
    """``samples`` right-padded to the longest of them.

    ``num_elements``: targets that are not :data:`IGNORE_INDEX` (LM) or the sample
    count (classification); ``num_tokens``: real input tokens.
    """
    length = max(int(sample.inputs.numel()) for sample in samples)
    inputs = torch.full((len(samples), length), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(samples), length), dtype=torch.int64)
    targets = torch.full((len(samples), length), IGNORE_INDEX, dtype=torch.int64)
    for row, sample in enumerate(samples):
        size = int(sample.inputs.numel())
        inputs[row, :size] = sample.inputs
        mask[row, :size] = 1
        if task is Task.LM:
            targets[row, :size] = sample.targets
    if task is not Task.LM:
        targets = torch.stack([sample.targets for sample in samples])
    elements = int((targets != IGNORE_INDEX).sum().item()) if task is Task.LM else len(samples)
    return Batch(
        inputs=inputs,
        targets=targets,
        num_samples=len(samples),
        num_elements=elements,
        num_tokens=int(mask.sum().item()),
        attention_mask=mask,
    )


@dataclass(frozen=True)
class TokenFileDataset:
    """Training and held-out samples of a tokenized data file, the pad id, and what was read.

    ``report``: counts of the build (rows, examples per split, truncated and dropped
    examples, trainable tokens, label names), written into the run's ``start`` record.
    Raises ``ValueError`` when either split is empty.
    """

    info: DataInfo
    train: list[Sample]
    held_out: list[Sample]
    pad_id: int
    report: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.train or not self.held_out:
            raise ValueError("a token file dataset needs training and held-out samples")

    def train_batches(
        self, micro_batch_size: int, *, rank: int, world_size: int, seed: int, start: int = 0
    ) -> Iterator[Batch]:
        """Endless micro-batches: each epoch a permutation from ``(seed, epoch)``, sharded by rank.

        Every rank gets ``N // world_size`` samples per epoch, cut into micro-batches of
        ``micro_batch_size`` with a shorter last one. ``start``: the stream begins at its
        micro-batch ``start``, the earlier ones never collated
        (:func:`trainer.data.epochs.sharded_epochs`). Raises :class:`TrainerError`
        (``spec_invalid``) when the training set has fewer samples than ranks.
        """
        examples = len(self.train)
        if examples < world_size:
            raise TrainerError(
                FailureReason.SPEC_INVALID, f"{examples} training examples cannot be shared by {world_size} ranks"
            )
        yield from sharded_epochs(
            lambda epoch: torch.randperm(examples, generator=epoch_generator(seed, epoch)),
            batches_per_rank(examples, world_size, micro_batch_size),
            lambda chunk: collate([self.train[int(index)] for index in chunk], self.pad_id, self.info.task),
            micro_batch_size,
            rank=rank,
            world_size=world_size,
            start=start,
        )

    def eval_batches(self, batch_size: int) -> Iterator[Batch]:
        """The held-out samples in file order, in batches of ``batch_size`` (the last may be shorter)."""
        for start in range(0, len(self.held_out), batch_size):
            yield collate(self.held_out[start : start + batch_size], self.pad_id, self.info.task)
