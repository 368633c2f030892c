"""What every dataset gives the training loop: task kind, sizes, micro-batches.

A dataset offers an endless, rank-sharded stream of training micro-batches and a
finite held-out evaluation set. Micro-batches carry the count of their
loss-bearing elements (samples, or non-padding target tokens for language
modelling), which the loop all-reduces to normalise an accumulation window.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, TypedDict

import torch

#: Target value of a padding token: ignored by the loss and not counted.
IGNORE_INDEX = -100


class Task(enum.StrEnum):
    """The kind of loss a dataset is trained with."""

    CLASSIFICATION = "classification"  # cross-entropy over classes, one element per sample
    REGRESSION = "regression"  # squared error averaged over outputs, one element per sample
    LM = "lm"  # next-token cross-entropy, one element per non-padding target token


@dataclass(frozen=True)
class DataInfo:
    """Sizes a model needs from its dataset.

    ``in_features``: input width of feature data (None for token data).
    ``num_outputs``: classes, regression outputs, or vocabulary size.
    ``seq_len``: context length of token data (None for feature data).
    ``label_names``: the class names of classification data labelled by name, by class id (None for
    integer labels); exported models carry them (``id2label``).
    """

    task: Task
    num_outputs: int
    in_features: int | None = None
    seq_len: int | None = None
    label_names: tuple[str, ...] | None = None

    @property
    def vocab_size(self) -> int:
        """Vocabulary size of token data (same as ``num_outputs``)."""
        return self.num_outputs


class DataInfoEntry(TypedDict):
    """A checkpoint's ``data_info`` entry (:func:`trainer.export.data_info_entry`): :class:`DataInfo`'s
    fields, in its order, the task as its string value."""

    task: str
    num_outputs: int
    in_features: int | None
    seq_len: int | None
    label_names: tuple[str, ...] | None


@dataclass(frozen=True)
class Batch:
    """One micro-batch.

    Feature data: ``inputs`` float32 ``[B, in_features]``; ``targets`` int64 ``[B]``
    (classification) or float32 ``[B, num_outputs]`` (regression).
    Token data: ``inputs`` and ``targets`` int64 ``[B, T]``, targets shifted by one and
    :data:`IGNORE_INDEX` at padding.
    Classification over text: ``inputs`` int64 ``[B, T]`` token ids, ``targets`` int64 ``[B]``.
    ``num_samples``: ``B``; ``num_elements``: loss-bearing elements (``B``, or valid
    target tokens); ``num_tokens``: input tokens for throughput (None for feature data).
    ``attention_mask``: int64 ``[B, T]``, 1 at real input tokens and 0 at right padding,
    for padded token data (``None`` where every input is real).
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    num_samples: int
    num_elements: int
    num_tokens: int | None = None
    attention_mask: torch.Tensor | None = None

    def to(self, device: torch.device) -> Batch:
        """The same batch with its tensors on ``device``."""
        mask = self.attention_mask
        return Batch(
            inputs=self.inputs.to(device, non_blocking=True),
            targets=self.targets.to(device, non_blocking=True),
            num_samples=self.num_samples,
            num_elements=self.num_elements,
            num_tokens=self.num_tokens,
            attention_mask=None if mask is None else mask.to(device, non_blocking=True),
        )


def feature_batch(inputs: torch.Tensor, targets: torch.Tensor) -> Batch:
    """A feature-data :class:`Batch`: every sample is one loss-bearing element."""
    size = int(inputs.shape[0])
    return Batch(inputs=inputs, targets=targets, num_samples=size, num_elements=size)


def token_batch(inputs: torch.Tensor, targets: torch.Tensor) -> Batch:
    """A token-data :class:`Batch`; elements are the targets that are not :data:`IGNORE_INDEX`."""
    valid = int((targets != IGNORE_INDEX).sum().item())
    return Batch(
        inputs=inputs,
        targets=targets,
        num_samples=int(inputs.shape[0]),
        num_elements=valid,
        num_tokens=int(inputs.numel()),
    )


class Dataset(Protocol):
    """A dataset as the loop sees it."""

    @property
    def info(self) -> DataInfo: ...

    def train_batches(
        self, micro_batch_size: int, *, rank: int, world_size: int, seed: int, start: int = 0
    ) -> Iterator[Batch]:
        """Endless training micro-batches of this rank's shard, from micro-batch ``start`` of the stream on.

        Within an epoch the ranks see disjoint samples and the same number of
        micro-batches of the same sizes; the order depends only on ``seed`` and the
        epoch number. The stream from ``start`` equals the whole stream with its first
        ``start`` micro-batches dropped, but builds none of them (a resume's position,
        :mod:`trainer.data.epochs`).
        """
        ...

    def eval_batches(self, batch_size: int) -> Iterator[Batch]:
        """The whole held-out set, once, in fixed order."""
        ...


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """A CPU generator seeded from ``(seed, epoch)``, identical on every rank."""
    return torch.Generator().manual_seed((seed * 1_000_003 + epoch) % (2**63))


def shard_indices(order: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's share of ``order`` (int64 ``[N]``): every ``world_size``-th entry from ``rank``.

    The tail that does not divide evenly is dropped, so every rank gets
    ``N // world_size`` entries and the shards are disjoint.
    """
    usable = order.shape[0] - order.shape[0] % world_size
    return order[rank:usable:world_size]
