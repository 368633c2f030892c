"""A data stream starts at any micro-batch by offset (issue 14 item 4): the stream from micro-batch ``n``
is the whole stream without its first ``n`` micro-batches."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest
import torch

from trainer.catalog import SyntheticConfig
from trainer.data import Batch, Dataset
from trainer.data.base import DataInfo, Task
from trainer.data.epochs import EpochPosition, epoch_position
from trainer.data.jsonl.batches import Sample, TokenFileDataset
from trainer.data.synthetic import build_synthetic
from trainer.data.text import ByteTextDataset


def _same(a: Batch, b: Batch) -> bool:
    masks = (a.attention_mask is None) == (b.attention_mask is None) and (
        a.attention_mask is None or torch.equal(a.attention_mask, b.attention_mask))  # type: ignore[arg-type]
    return (torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets) and masks
            and (a.num_samples, a.num_elements, a.num_tokens) == (b.num_samples, b.num_elements, b.num_tokens))


def _synthetic() -> Dataset:
    return build_synthetic(SyntheticConfig(in_features=4, num_samples=23, seed=1))


def _text() -> Dataset:
    data = torch.arange(211, dtype=torch.int64).remainder(256).to(torch.uint8)
    return ByteTextDataset(DataInfo(task=Task.LM, num_outputs=256, seq_len=6), train=data[:200], held_out=data[200:])


def _tokens() -> Dataset:
    generator = torch.Generator().manual_seed(0)
    samples = [Sample(torch.randint(0, 50, (n,), generator=generator), torch.randint(0, 50, (n,), generator=generator))
               for n in [3, 5, 2, 7, 4, 6, 1, 8, 5, 3, 2, 4, 6]]
    return TokenFileDataset(DataInfo(task=Task.LM, num_outputs=50, seq_len=8), train=samples, held_out=samples[:2],
                            pad_id=0)


@pytest.mark.parametrize("dataset", [_synthetic, _text, _tokens], ids=["arrays", "text", "tokens"])
@pytest.mark.parametrize(("world_size", "micro_batch_size"), [(1, 4), (2, 3), (3, 2)])
def test_the_stream_from_an_offset_is_the_stream_without_its_head(
    dataset: Callable[[], Dataset], world_size: int, micro_batch_size: int
) -> None:
    data = dataset()
    for rank in range(world_size):
        def stream(start: int = 0, rank: int = rank) -> Iterator[Batch]:
            return data.train_batches(micro_batch_size, rank=rank, world_size=world_size, seed=5, start=start)

        whole = list(itertools.islice(stream(), 40))  # several epochs
        for start in (1, 3, 7, 12, 25):
            tail = list(itertools.islice(stream(start), 40 - start))
            assert len(tail) == 40 - start and all(_same(a, b) for a, b in zip(whole[start:], tail)), (rank, start)


def test_epoch_positions() -> None:
    assert epoch_position(0, 3) == EpochPosition(0, 0) and epoch_position(7, 3) == EpochPosition(2, 1)
    sizes = [2, 3, 1, 4]
    assert [epoch_position(n, lambda e: sizes[e % 4]) for n in (0, 1, 2, 5, 6, 9, 10)] == [
        (0, 0), (0, 1), (1, 0), (2, 0), (3, 0), (3, 3), (4, 0)]
    with pytest.raises(ValueError):
        epoch_position(-1, 3)
    with pytest.raises(ValueError):
        epoch_position(1, lambda e: 0)
