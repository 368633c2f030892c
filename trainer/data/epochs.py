"""The endless, rank-sharded stream of training micro-batches, and where a resumed stream starts.

Every dataset trains on epochs: epoch ``e`` orders the training items by a permutation
from ``(seed, e)`` (:func:`trainer.data.base.epoch_generator`), rank ``r`` takes every
``world_size``-th item of it (:func:`trainer.data.base.shard_indices`) and cuts its share
into micro-batches. The stream is the epochs one after another, so micro-batch ``n`` of
the stream is a position ``(epoch, batch within the epoch)`` that the epochs' sizes
alone determine. :func:`sharded_epochs` starts the stream at any ``n`` directly: a
resumed run skips the epochs before its position by their sizes and the batches of its
first epoch by index, and builds no micro-batch before the one it needs, yet yields
exactly what the uninterrupted stream yields from ``n`` on.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import NamedTuple

from torch import Tensor

from trainer.data.base import Batch, shard_indices


class EpochPosition(NamedTuple):
    """Micro-batch ``batch`` (0-based) of epoch ``epoch``."""

    epoch: int
    batch: int


def batches_per_rank(items: int, world_size: int, micro_batch_size: int) -> int:
    """Micro-batches of one rank in an epoch of ``items``: ``items // world_size`` items each, a shorter last one."""
    return math.ceil(items // world_size / micro_batch_size)


def epoch_position(start: int, batches_in_epoch: int | Callable[[int], int]) -> EpochPosition:
    """Where micro-batch ``start`` of the stream lies.

    ``batches_in_epoch``: every epoch's micro-batches (a number), or a function of the
    epoch (for datasets whose epochs differ in size; called once per epoch skipped, it
    must not build batches). Raises ``ValueError`` for a negative ``start`` or an empty epoch.
    """
    if start < 0:
        raise ValueError(f"a stream starts at micro-batch 0 or later, not {start}")
    if isinstance(batches_in_epoch, int):
        if batches_in_epoch < 1:
            raise ValueError("an epoch without micro-batches")
        return EpochPosition(*divmod(start, batches_in_epoch))
    epoch = 0
    while start >= (size := batches_in_epoch(epoch)):
        if size < 1:
            raise ValueError(f"epoch {epoch} has no micro-batches")
        start -= size
        epoch += 1
    return EpochPosition(epoch, start)


def sharded_epochs(
    epoch_order: Callable[[int], Tensor],
    batches_in_epoch: int | Callable[[int], int],
    build: Callable[[Tensor], Batch],
    micro_batch_size: int,
    *,
    rank: int,
    world_size: int,
    start: int = 0,
) -> Iterator[Batch]:
    """This rank's endless micro-batches, from micro-batch ``start`` of the stream on.

    Args:
        epoch_order: epoch ``e`` → the order of its items (int64 ``[N_e]``, the same on every rank).
        batches_in_epoch: this rank's micro-batches per epoch (see :func:`epoch_position`);
            must equal the chunks of ``epoch_order`` sharded and split, or the positions drift.
        build: this rank's item indices of one micro-batch → the micro-batch.
        micro_batch_size: items per micro-batch (the epoch's last may be shorter).
        rank, world_size: the shard.
        start: micro-batches of the stream to skip, without building them.
    """
    first, skip = epoch_position(start, batches_in_epoch)
    for epoch in itertools.count(first):
        chunks = shard_indices(epoch_order(epoch), rank, world_size).split(micro_batch_size)
        for chunk in chunks[skip:]:
            yield build(chunk)
        skip = 0
