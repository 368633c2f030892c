"""Dataset registry: digits, synthetic and text shapes, dtypes, held-out splits and rank sharding."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from halfcast.contracts.catalog import DigitsDataset, SyntheticDataset, TextConfig, TextDataset
from trainer.data import IGNORE_INDEX, Batch, Task, build_dataset
from trainer.data.arrays import ArrayDataset
from trainer.data.base import shard_indices, token_batch
from trainer.data.sources import resolve_data_file
from trainer.data.text import ByteTextDataset, build_text
from trainer.errors import TrainerError


def _arrays(spec: DigitsDataset | SyntheticDataset) -> ArrayDataset:
    """The tensors ``spec`` builds (digits and synthetic data are arrays)."""
    data = build_dataset(spec)
    assert isinstance(data, ArrayDataset), type(data)
    return data


def _epoch(batches: list[Batch]) -> torch.Tensor:
    return torch.cat([b.inputs for b in batches])


def test_digits_shapes_dtypes_and_stratified_split() -> None:
    data = _arrays(DigitsDataset(name="digits", config={"test_fraction": 0.2, "split_seed": 0}))
    assert data.info.task is Task.CLASSIFICATION
    assert (data.info.in_features, data.info.num_outputs) == (64, 10)
    assert data.train_x.shape == (1437, 64) and data.eval_x.shape == (360, 64)
    assert data.train_x.dtype == torch.float32 and data.train_y.dtype == torch.int64
    assert float(data.train_x.min()) >= 0.0 and float(data.train_x.max()) <= 1.0
    train_share = torch.bincount(data.train_y, minlength=10) / 1437
    eval_share = torch.bincount(data.eval_y, minlength=10) / 360
    assert torch.allclose(train_share, eval_share, atol=0.01)


def test_digits_split_depends_on_split_seed_only() -> None:
    a = _arrays(DigitsDataset(name="digits", config={"split_seed": 1}))
    b = _arrays(DigitsDataset(name="digits", config={"split_seed": 1}))
    c = _arrays(DigitsDataset(name="digits", config={"split_seed": 2}))
    assert torch.equal(a.eval_x, b.eval_x)
    assert not torch.equal(a.eval_x, c.eval_x)


def test_synthetic_regression_and_classification() -> None:
    config = {"in_features": 8, "out_features": 3, "num_samples": 50}
    reg = _arrays(SyntheticDataset(name="synthetic", config=config))
    assert reg.info.task is Task.REGRESSION and reg.info.num_outputs == 3
    assert reg.train_x.shape == (50, 8) and reg.train_y.shape == (50, 3) and reg.eval_x.shape == (10, 8)
    assert reg.train_y.dtype == torch.float32
    cls = _arrays(SyntheticDataset(name="synthetic", config={"task": "classification", "num_classes": 4}))
    assert cls.info.task is Task.CLASSIFICATION and cls.info.num_outputs == 4
    assert cls.train_y.dtype == torch.int64 and set(cls.train_y.unique().tolist()) <= {0, 1, 2, 3}


def test_synthetic_target_scale_scales_the_targets() -> None:
    base = _arrays(SyntheticDataset(name="synthetic", config={"seed": 5}))
    scaled = _arrays(SyntheticDataset(name="synthetic", config={"seed": 5, "target_scale": 1e-4}))
    assert torch.equal(base.train_x, scaled.train_x)
    assert torch.allclose(scaled.train_y, base.train_y * 1e-4)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_feature_shards_are_disjoint_equal_and_cover_the_epoch(world_size: int) -> None:
    data = build_dataset(SyntheticDataset(name="synthetic", config={"num_samples": 100, "in_features": 4}))
    per_rank = 100 // world_size
    batches_per_epoch = -(-per_rank // 8)
    shards = []
    for rank in range(world_size):
        stream = data.train_batches(8, rank=rank, world_size=world_size, seed=7)
        batches = list(itertools.islice(stream, batches_per_epoch))
        assert [b.num_samples for b in batches] == [min(8, per_rank - 8 * i) for i in range(batches_per_epoch)]
        shards.append({tuple(row.tolist()) for row in _epoch(batches)})
    assert all(len(shard) == per_rank for shard in shards)
    assert len(set().union(*shards)) == per_rank * world_size


def test_training_order_is_deterministic_and_changes_per_epoch() -> None:
    data = build_dataset(SyntheticDataset(name="synthetic", config={"num_samples": 32}))
    first = list(itertools.islice(data.train_batches(32, rank=0, world_size=1, seed=1), 2))
    again = list(itertools.islice(data.train_batches(32, rank=0, world_size=1, seed=1), 2))
    other = next(data.train_batches(32, rank=0, world_size=1, seed=2))
    assert torch.equal(first[0].inputs, again[0].inputs) and torch.equal(first[1].inputs, again[1].inputs)
    assert not torch.equal(first[0].inputs, first[1].inputs)
    assert not torch.equal(first[0].inputs, other.inputs)


def test_shard_indices_drop_the_uneven_tail() -> None:
    order = torch.arange(10)
    assert shard_indices(order, 0, 3).tolist() == [0, 3, 6]
    assert shard_indices(order, 2, 3).tolist() == [2, 5, 8]


def test_too_few_samples_for_the_ranks() -> None:
    data = build_dataset(SyntheticDataset(name="synthetic", config={"num_samples": 1}))
    with pytest.raises(TrainerError):
        next(data.train_batches(4, rank=0, world_size=2, seed=0))


def test_token_batch_counts_valid_targets() -> None:
    targets = torch.tensor([[1, 2, IGNORE_INDEX], [IGNORE_INDEX, IGNORE_INDEX, 3]])
    batch = token_batch(torch.zeros(2, 3, dtype=torch.int64), targets)
    assert (batch.num_samples, batch.num_elements, batch.num_tokens) == (2, 3, 6)


def _bytes_dataset(size: int, seq_len: int) -> ByteTextDataset:
    from trainer.data import DataInfo

    data = (torch.arange(size) % 251).to(torch.uint8)
    return ByteTextDataset(info=DataInfo(Task.LM, 256, seq_len=seq_len), train=data, held_out=data[:20].clone())


def test_text_windows_shift_targets_and_shard_by_rank() -> None:
    data = _bytes_dataset(200, seq_len=4)
    batch = next(data.train_batches(6, rank=0, world_size=1, seed=0))
    assert batch.inputs.shape == (6, 4) and batch.inputs.dtype == torch.int64
    assert torch.equal(batch.targets[:, :-1], batch.inputs[:, 1:])
    assert batch.num_elements == 24 and batch.num_tokens == 24
    starts = [
        {
            int(row[0])
            for b in itertools.islice(data.train_batches(4, rank=r, world_size=2, seed=0), 5)
            for row in b.inputs
        }
        for r in range(2)
    ]
    assert not starts[0] & starts[1]


def test_text_eval_covers_the_held_out_bytes() -> None:
    data = _bytes_dataset(200, seq_len=4)
    batches = list(data.eval_batches(2))
    assert sum(b.num_samples for b in batches) == 4  # 20 held-out bytes, windows of 5
    short = _bytes_dataset(200, seq_len=64)
    (only,) = list(short.eval_batches(8))
    assert only.inputs.shape == (1, 19)


def test_text_from_the_standard_library() -> None:
    config = TextConfig(source="python-stdlib", seq_len=16, max_bytes=20_000, test_fraction=0.1)
    data = build_text(config)
    again = build_text(config)
    assert data.info.task is Task.LM and data.info.vocab_size == 256 and data.info.seq_len == 16
    assert data.train.numel() + data.held_out.numel() == 20_000
    assert torch.equal(data.train, again.train) and torch.equal(data.held_out, again.held_out)
    assert data.held_out.numel() == 2000


def test_text_file_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    (root / "books").mkdir(parents=True)
    (root / "books" / "a.txt").write_bytes(b"hello world, " * 200)
    monkeypatch.setenv("HALFCAST_DATA_ROOTS", str(root))
    data = build_dataset(TextDataset(name="text", config={"source": "file", "path": "books/a.txt", "seq_len": 8}))
    assert isinstance(data, ByteTextDataset)
    assert data.train.numel() + data.held_out.numel() == 2600


def test_text_file_escapes_are_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    root.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"x" * 5000)
    (root / "link.txt").symlink_to(secret)
    monkeypatch.setenv("HALFCAST_DATA_ROOTS", str(root))
    for path in ("link.txt", "missing.txt"):
        with pytest.raises(TrainerError) as info:
            build_dataset(TextDataset(name="text", config={"source": "file", "path": path}))
        assert info.value.reason == "data_unavailable", path
    for path in (str(secret), "../secret.txt"):  # refused by the spec, and by the trainer too
        with pytest.raises(ValidationError):
            TextDataset(name="text", config={"source": "file", "path": path})
        with pytest.raises(TrainerError):
            resolve_data_file(path, [root])
