"""In-memory feature datasets (one row per sample), shared by ``digits`` and ``synthetic``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from halfcast.contracts.status import FailureReason
from trainer.data.base import Batch, DataInfo, epoch_generator, feature_batch
from trainer.data.epochs import batches_per_rank, sharded_epochs
from trainer.errors import TrainerError


@dataclass(frozen=True)
class ArrayDataset:
    """Train and held-out tensors with the first dimension indexing samples.

    ``train_x``/``eval_x``: float32 ``[N, in_features]``; ``train_y``/``eval_y``: int64
    ``[N]`` (classification) or float32 ``[N, outputs]`` (regression).
    Raises ``ValueError`` when the sample counts of inputs and targets differ.
    """

    info: DataInfo
    train_x: torch.Tensor
    train_y: torch.Tensor
    eval_x: torch.Tensor
    eval_y: torch.Tensor

    def __post_init__(self) -> None:
        if self.train_x.shape[0] != self.train_y.shape[0] or self.eval_x.shape[0] != self.eval_y.shape[0]:
            raise ValueError("inputs and targets must hold the same number of samples")

    def train_batches(
        self, micro_batch_size: int, *, rank: int, world_size: int, seed: int, start: int = 0
    ) -> Iterator[Batch]:
        """Endless micro-batches: each epoch a fresh permutation from ``(seed, epoch)``, sharded by rank.

        Every rank gets ``N // world_size`` samples per epoch, cut into micro-batches of
        ``micro_batch_size`` with a shorter last one. ``start``: the stream begins at its
        micro-batch ``start``, the earlier ones neither built nor drawn
        (:func:`trainer.data.epochs.sharded_epochs`). Raises :class:`TrainerError`
        (``spec_invalid``) when the training set has fewer samples than ranks.
        """
        samples = self.train_x.shape[0]
        if samples < world_size:
            msg = f"{samples} training samples cannot be shared by {world_size} ranks"
            raise TrainerError(FailureReason.SPEC_INVALID, msg)
        yield from sharded_epochs(
            lambda epoch: torch.randperm(samples, generator=epoch_generator(seed, epoch)),
            batches_per_rank(samples, world_size, micro_batch_size),
            lambda chunk: feature_batch(self.train_x[chunk], self.train_y[chunk]),
            micro_batch_size,
            rank=rank,
            world_size=world_size,
            start=start,
        )

    def eval_batches(self, batch_size: int) -> Iterator[Batch]:
        """The held-out samples in stored order, in batches of ``batch_size`` (the last may be shorter)."""
        for start in range(0, self.eval_x.shape[0], batch_size):
            stop = start + batch_size
            yield feature_batch(self.eval_x[start:stop], self.eval_y[start:stop])
