"""A resumed run positions its data stream by offset (issue 14 item 4): the stream from micro-batch ``n``
is the whole stream without its first ``n`` micro-batches, and a resume at step N builds no batch of the
steps before N."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_support import lora_spec

from halfcast.contracts.catalog import SyntheticConfig
from halfcast.contracts.spec import JobSpec
from trainer.data import Batch, Dataset
from trainer.data.base import DataInfo, Task
from trainer.data.epochs import EpochPosition, epoch_position
from trainer.data.jsonl.batches import Sample, TokenFileDataset
from trainer.data.synthetic import build_synthetic
from trainer.data.text import ByteTextDataset
from trainer.parallel.distributed import DistContext
from trainer.run import loop
from trainer.run.checkpoint import final_path, load_checkpoint, step_path


def _same(a: Batch, b: Batch) -> bool:
    masks = (a.attention_mask is None) == (b.attention_mask is None) and (
        a.attention_mask is None or (b.attention_mask is not None and torch.equal(a.attention_mask, b.attention_mask))
    )
    return (
        torch.equal(a.inputs, b.inputs)
        and torch.equal(a.targets, b.targets)
        and masks
        and (a.num_samples, a.num_elements, a.num_tokens) == (b.num_samples, b.num_elements, b.num_tokens)
    )


def _synthetic() -> Dataset:
    return build_synthetic(SyntheticConfig(in_features=4, num_samples=23, seed=1))


def _text() -> Dataset:
    data = torch.arange(211, dtype=torch.int64).remainder(256).to(torch.uint8)
    return ByteTextDataset(DataInfo(task=Task.LM, num_outputs=256, seq_len=6), train=data[:200], held_out=data[200:])


def _tokens() -> Dataset:
    generator = torch.Generator().manual_seed(0)
    samples = [
        Sample(torch.randint(0, 50, (n,), generator=generator), torch.randint(0, 50, (n,), generator=generator))
        for n in [3, 5, 2, 7, 4, 6, 1, 8, 5, 3, 2, 4, 6]
    ]
    return TokenFileDataset(
        DataInfo(task=Task.LM, num_outputs=50, seq_len=8), train=samples, held_out=samples[:2], pad_id=0
    )


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
            assert len(tail) == 40 - start and all(_same(a, b) for a, b in zip(whole[start:], tail, strict=True)), (
                rank,
                start,
            )


def test_epoch_positions() -> None:
    assert epoch_position(0, 3) == EpochPosition(0, 0) and epoch_position(7, 3) == EpochPosition(2, 1)
    sizes = [2, 3, 1, 4]
    assert [epoch_position(n, lambda e: sizes[e % 4]) for n in (0, 1, 2, 5, 6, 9, 10)] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (2, 0),
        (3, 0),
        (3, 3),
        (4, 0),
    ]
    with pytest.raises(ValueError):
        epoch_position(-1, 3)
    with pytest.raises(ValueError):
        epoch_position(1, lambda e: 0)


# ----------------------------------------------------------------------------- a resumed job


def _count_builds(monkeypatch: pytest.MonkeyPatch, dataset: str) -> list[int]:
    """Count the micro-batches built (``collate`` for jsonl files); note the count when the run's first step begins."""
    from trainer.data import arrays
    from trainer.data.jsonl import batches

    target, name = {
        "synthetic": (arrays, "feature_batch"),
        "text": (ByteTextDataset, "_windows"),
        "jsonl": (batches, "collate"),
    }[dataset]
    original, counts = getattr(target, name), [0]

    def counted(*args: Any, **kwargs: Any) -> Batch:
        counts[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, staticmethod(counted) if target is ByteTextDataset else counted)
    built_before_first_step: list[int] = []
    step = loop.train_step

    def first_step_noted(*args: Any, **kwargs: Any) -> Any:
        if not built_before_first_step:
            built_before_first_step.append(counts[0])
        return step(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", first_step_noted)
    return built_before_first_step


def _spec(dataset: str) -> JobSpec:
    steps = {
        "micro_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "max_steps": 9,
        "checkpoint_interval": 7,
        "log_interval": 3,
        "seed": 4,
        "optimizer": {"name": "adamw", "lr": 0.01},
    }
    if dataset == "jsonl":
        data = {"name": "jsonl", "config": {"path": "d.jsonl", "format": "text", "max_seq_len": 16}}
        return JobSpec.model_validate(lora_spec(dataset=data, **steps | {"micro_batch_size": 2}))
    if dataset == "synthetic":
        data = {"name": "synthetic", "config": {"in_features": 8, "num_samples": 48, "seed": 2}}
        return JobSpec.model_validate(
            {"model": {"name": "mlp", "config": {"hidden_sizes": [16]}}, "dataset": data, **steps}
        )
    data = {"name": "text", "config": {"seq_len": 8, "max_bytes": 3000, "test_fraction": 0.1}}
    return JobSpec.model_validate(
        {"model": {"name": "gpt", "config": {"n_layer": 1, "n_head": 2, "d_model": 16}}, "dataset": data, **steps}
    )


@pytest.fixture
def data_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``d.jsonl`` (13 rows of text) under a fresh data root."""
    (tmp_path / "data").mkdir()
    rows = [f'{{"text": "row {i}: {"abc " * (i % 4 + 1)}"}}' for i in range(13)]
    (tmp_path / "data" / "d.jsonl").write_text("\n".join(rows) + "\n")
    monkeypatch.setenv("HALFCAST_DATA_ROOTS", str(tmp_path / "data"))


@pytest.mark.parametrize("dataset", ["synthetic", "text", "jsonl"])
def test_a_resume_at_step_n_builds_no_batch_of_the_steps_before_it(
    dataset: str, cpu_ctx: DistContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """Step 7 of 2 micro-batches each lies epochs into the stream (synthetic: 3 micro-batches per epoch, jsonl:
    6 of 2 rows); the resumed run builds only step 8's window before step 8, and ends bit-identical to the
    straight run."""
    if dataset == "jsonl":
        request.getfixturevalue("model_roots")
        request.getfixturevalue("data_file")
    spec = _spec(dataset)
    loop.train(spec, tmp_path / "whole", cpu_ctx)
    built_before_first_step = _count_builds(monkeypatch, dataset)
    loop.train(spec, tmp_path / "resumed", cpu_ctx, resume_from=step_path(tmp_path / "whole", 7))
    assert built_before_first_step == [2]  # step 8's window, not the 14 micro-batches of steps 1-7 first
    whole, resumed = load_checkpoint(final_path(tmp_path / "whole")), load_checkpoint(final_path(tmp_path / "resumed"))
    for part in ("model", "optimizer", "lr_scheduler", "precision", "counters"):
        assert str(whole[part]) == str(resumed[part]), part
    assert all(torch.equal(whole["model"][k], resumed["model"][k]) for k in whole["model"])
