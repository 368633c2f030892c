"""Byte-level language modelling: the vocabulary is the 256 byte values.

The text is split once: the last ``test_fraction`` of the bytes are held out for
evaluation. A training sample is a window of ``seq_len + 1`` consecutive bytes
(inputs are its first ``seq_len`` bytes, targets the last ``seq_len``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from halfcast.contracts.catalog import TextConfig
from halfcast.contracts.status import FailureReason
from trainer.data.base import Batch, DataInfo, Task, epoch_generator, token_batch
from trainer.data.epochs import batches_per_rank, sharded_epochs
from trainer.data.sources import read_data_file, read_stdlib
from trainer.errors import TrainerError

VOCAB_SIZE = 256


@dataclass(frozen=True)
class ByteTextDataset:
    """Training and held-out bytes (uint8 ``[N]`` and ``[M]``) and the model's context length.

    Raises ``ValueError`` when ``info`` has no ``seq_len``, and :class:`TrainerError`
    (``data_unavailable``) when the training bytes hold no full window or the held-out
    bytes fewer than two.
    """

    info: DataInfo
    train: torch.Tensor
    held_out: torch.Tensor

    def __post_init__(self) -> None:
        if self.info.seq_len is None:
            raise ValueError("byte-level text needs a seq_len")
        if self.train.numel() < self.window or self.held_out.numel() < 2:
            msg = (
                f"text too short: {self.train.numel()} training bytes for windows of {self.window}, "
                f"{self.held_out.numel()} held-out bytes"
            )
            raise TrainerError(FailureReason.DATA_UNAVAILABLE, msg)

    @property
    def window(self) -> int:
        """Bytes per sample: ``seq_len + 1``."""
        return (self.info.seq_len or 0) + 1

    def train_batches(
        self, micro_batch_size: int, *, rank: int, world_size: int, seed: int, start: int = 0
    ) -> Iterator[Batch]:
        """Endless micro-batches of random, non-overlapping windows, sharded by rank.

        Each epoch draws a random offset and a random order of the windows that start
        at ``offset + k * window``, both from ``(seed, epoch)``; rank ``r`` takes every
        ``world_size``-th window. Inputs and targets: int64 ``[B, seq_len]``. ``start``:
        the stream begins at its micro-batch ``start``; the epochs before it draw only
        their offsets (which fix their sizes), and no earlier batch is built
        (:func:`trainer.data.epochs.sharded_epochs`). Raises :class:`TrainerError`
        (``spec_invalid``) when an epoch holds fewer windows than ranks.
        """
        size, window = self.train.numel(), self.window
        if size < window * world_size:
            msg = f"{size} training bytes hold fewer windows of {window} bytes than the {world_size} ranks"
            raise TrainerError(FailureReason.SPEC_INVALID, msg)
        spread = min(window, size - window * world_size + 1)

        def offset(generator: torch.Generator) -> int:
            """The epoch's first window start: its generator's first draw."""
            return int(torch.randint(spread, (1,), generator=generator).item())

        def order(epoch: int) -> torch.Tensor:
            generator = epoch_generator(seed, epoch)
            starts = torch.arange(offset(generator), size - window + 1, window)
            return starts[torch.randperm(starts.numel(), generator=generator)]

        def batches_in(epoch: int) -> int:
            windows = len(range(offset(epoch_generator(seed, epoch)), size - window + 1, window))
            return batches_per_rank(windows, world_size, micro_batch_size)

        yield from sharded_epochs(
            order,
            batches_in,
            lambda chunk: self._windows(self.train, chunk, window),
            micro_batch_size,
            rank=rank,
            world_size=world_size,
            start=start,
        )

    def eval_batches(self, batch_size: int) -> Iterator[Batch]:
        """Consecutive non-overlapping windows over the held-out bytes (one shorter window if none fits)."""
        size = self.held_out.numel()
        window = min(self.window, size)
        starts = torch.arange(0, size - window + 1, window)
        for chunk in starts.split(batch_size):
            yield self._windows(self.held_out, chunk, window)

    @staticmethod
    def _windows(data: torch.Tensor, starts: torch.Tensor, window: int) -> Batch:
        rows = data[starts.unsqueeze(1) + torch.arange(window)].long()
        return token_batch(rows[:, :-1].contiguous(), rows[:, 1:].contiguous())


def build_text(config: TextConfig) -> ByteTextDataset:
    """Read the source named by ``config`` and split off the held-out tail.

    Raises :class:`TrainerError` (``data_unavailable``) when the source is missing, outside
    the data roots, or too short.
    """
    if config.source == "python-stdlib":
        raw = read_stdlib(config.max_bytes)
    elif config.path is None:
        raise TrainerError(FailureReason.DATA_UNAVAILABLE, "text source 'file' needs a 'path'")
    else:
        raw = read_data_file(config.path, config.max_bytes)
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    held = max(2, round(data.numel() * config.test_fraction))
    return ByteTextDataset(
        info=DataInfo(task=Task.LM, num_outputs=VOCAB_SIZE, seq_len=config.seq_len),
        train=data[: data.numel() - held].clone(),
        held_out=data[data.numel() - held :].clone(),
    )
