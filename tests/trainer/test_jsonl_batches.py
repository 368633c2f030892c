"""``jsonl`` datasets in the loop: truncation and drop counts, padding, rank sharding, C17 token normalisation."""

from __future__ import annotations

import copy
import itertools
import json
import logging
from pathlib import Path
from typing import cast

import pytest
import torch
from hf_tokenizer_support import hf_tokenizer_fixture  # noqa: F401 (the hf_tokenizer fixture)
from jsonl_support import DataRoot, trained_spans
from trainer_support import grad_of

from halfcast.contracts.catalog import TextConfig
from trainer.data import IGNORE_INDEX, Batch, Task
from trainer.data.jsonl.batches import collate
from trainer.data.text import build_text
from trainer.errors import TrainerError
from trainer.losses import task_loss
from trainer.models.gpt import GPT
from trainer.numerics.precision import build_precision
from trainer.parallel.distributed import DistContext
from trainer.run.loop import _data_report
from trainer.run.step import accumulate_window


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DataRoot:
    return DataRoot(tmp_path / "root", monkeypatch)


def _lines(rows: list[dict]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def _words(count: int) -> str:
    return " ".join(["the quick brown fox"] * count)


def test_truncation_is_counted_and_cuts_to_max_seq_len(hf_tokenizer, root: DataRoot) -> None:
    rows = [{"text": _words(20)}, {"text": "Hello"}, {"text": _words(30)}, {"text": "Hi"}]
    dataset = root.build(
        hf_tokenizer, root.write("d.jsonl", _lines(rows)), format="text", max_seq_len=16, test_fraction=0.25
    )
    samples = [*dataset.train, *dataset.held_out]
    assert max(s.inputs.numel() for s in samples) == 16 and max(s.targets.numel() for s in samples) == 16
    assert dataset.report["truncated"] == 2 and dataset.report["dropped_no_trainable_tokens"] == 0
    assert dataset.info.seq_len == 16
    assert dataset.report["trainable_tokens"] == sum(int((s.targets != IGNORE_INDEX).sum()) for s in dataset.train)


def test_an_answer_cut_away_by_truncation_is_dropped_and_counted(hf_tokenizer, root: DataRoot) -> None:
    long_prompt = {"instruction": _words(20), "output": "yes"}
    short = {"instruction": "Say hi.", "output": "hi"}
    dataset = root.build(
        hf_tokenizer,
        root.write("d.jsonl", _lines([long_prompt, short, long_prompt, short, short])),
        format="instruction",
        max_seq_len=32,
        test_fraction=0.2,
    )
    assert dataset.report["dropped_no_trainable_tokens"] == 2 and dataset.report["truncated"] == 2
    train_examples, held_out_examples = dataset.report["train_examples"], dataset.report["held_out_examples"]
    assert isinstance(train_examples, int) and isinstance(held_out_examples, int)
    assert train_examples + held_out_examples == 3
    dropped = cast(dict[str, int], dataset.report["dropped_rows"])  # issue 25 item 6: per split
    assert dropped["train"] + dropped["held_out"] == 2
    assert dataset.report["held_out_examples"] == 1 - dropped["held_out"]  # one row held out of five
    assert dataset.report["train_examples"] == 4 - dropped["train"]
    assert all(trained_spans(hf_tokenizer, s.targets) == ["hi</s>"] for s in [*dataset.train, *dataset.held_out])


def test_when_truncation_leaves_nothing_to_train_the_job_fails(hf_tokenizer, root: DataRoot) -> None:
    path = root.write("d.jsonl", _lines([{"instruction": _words(20), "output": "yes"}] * 3))
    with pytest.raises(TrainerError, match="no training example has a trainable token left") as info:
        root.build(hf_tokenizer, path, format="instruction", max_seq_len=8)
    assert info.value.reason == "data_unavailable"


def test_micro_batches_pad_to_their_longest_example(hf_tokenizer, root: DataRoot) -> None:
    rows = [{"text": "Hi"}, {"text": _words(2)}, {"text": "Hello there"}, {"text": "fox"}]
    dataset = root.build(
        hf_tokenizer, root.write("d.jsonl", _lines(rows)), format="text", max_seq_len=64, test_fraction=0.25
    )
    batch = collate(dataset.train, dataset.pad_id, Task.LM)
    lengths = [s.inputs.numel() for s in dataset.train]
    assert batch.inputs.shape == (3, max(lengths)) and max(lengths) < 64
    assert batch.attention_mask is not None and batch.attention_mask.sum(1).tolist() == lengths
    padding = batch.attention_mask == 0
    assert padding.any() and (batch.inputs[padding] == hf_tokenizer.pad_token_id).all()
    assert (batch.targets[padding] == IGNORE_INDEX).all()
    assert batch.num_tokens == sum(lengths) and batch.num_elements == int((batch.targets != IGNORE_INDEX).sum())


def test_batch_to_moves_the_attention_mask() -> None:
    mask = torch.ones(2, 3, dtype=torch.int64)
    moved = Batch(torch.zeros(2, 3), torch.zeros(2, 3), 2, 6, 6, attention_mask=mask).to(torch.device("meta"))
    assert moved.attention_mask is not None and moved.attention_mask.device.type == "meta"
    assert Batch(torch.zeros(2, 3), torch.zeros(2, 3), 2, 6).to(torch.device("meta")).attention_mask is None


def _row_ids(batches: list[Batch]) -> list[str]:
    return [str(row[row != 0].tolist()) for batch in batches for row in batch.inputs]


def test_two_ranks_get_disjoint_shards_that_cover_the_epoch(hf_tokenizer, root: DataRoot) -> None:
    rows = [{"text": f"row {i} " + "fox " * (i % 5)} for i in range(21)]
    dataset = root.build(hf_tokenizer, root.write("d.jsonl", _lines(rows)), format="text", test_fraction=0.05)
    assert len(dataset.train) == 20
    per_epoch = 10 // 4 + 1  # 10 samples per rank in micro-batches of 4: 4, 4, 2
    shards = [
        list(itertools.islice(dataset.train_batches(4, rank=r, world_size=2, seed=3), 2 * per_epoch)) for r in range(2)
    ]
    for rank_batches in shards:
        assert [b.num_samples for b in rank_batches[:per_epoch]] == [4, 4, 2]
    first = [set(_row_ids(s[:per_epoch])) for s in shards]
    assert not first[0] & first[1] and len(first[0] | first[1]) == 20
    assert {str(s.inputs[s.inputs != 0].tolist()) for s in dataset.train} == first[0] | first[1]
    second = [_row_ids(s[per_epoch:]) for s in shards]
    assert second != [_row_ids(s[:per_epoch]) for s in shards]  # a new order each epoch
    again = list(itertools.islice(dataset.train_batches(4, rank=0, world_size=2, seed=3), per_epoch))
    assert _row_ids(again) == _row_ids(shards[0][:per_epoch])


def test_the_split_is_fixed_by_split_seed(hf_tokenizer, root: DataRoot) -> None:
    path = root.write("d.jsonl", _lines([{"text": f"row {i}"} for i in range(20)]))

    def held(seed: int) -> list[list[int]]:
        dataset = root.build(hf_tokenizer, path, format="text", test_fraction=0.25, split_seed=seed)
        return [s.inputs.tolist() for s in dataset.held_out]

    assert len(held(1)) == 5 and held(1) == held(1) and held(1) != held(2)


def test_eval_batches_cover_the_held_out_set_once(hf_tokenizer, root: DataRoot) -> None:
    path = root.write("d.jsonl", _lines([{"text": f"row {i}"} for i in range(20)]))
    dataset = root.build(hf_tokenizer, path, format="text", test_fraction=0.25)
    batches = list(dataset.eval_batches(2))
    assert [b.num_samples for b in batches] == [2, 2, 1]
    pairs = [(row, m) for b in batches for row, m in zip(b.inputs, _mask(b), strict=True)]
    assert [row[m == 1].tolist() for row, m in pairs] == [s.inputs.tolist() for s in dataset.held_out]


def test_without_a_tokenizer_the_jsonl_dataset_is_spec_invalid(root: DataRoot) -> None:
    with pytest.raises(TrainerError, match="needs the model's tokenizer") as info:
        root.build(None, root.write("d.jsonl", '{"text": "a"}\n{"text": "b"}\n'), format="text")
    assert info.value.reason == "spec_invalid"


def test_a_small_held_out_split_is_warned_about(hf_tokenizer, root: DataRoot, caplog: pytest.LogCaptureFixture) -> None:
    rows = "".join(json.dumps({"text": f"row {n}"}) + "\n" for n in range(40))
    with caplog.at_level(logging.WARNING, logger="trainer.data.jsonl.build"):
        root.build(hf_tokenizer, root.write("small.jsonl", rows), format="text", test_fraction=0.1)
    assert any("only 4 held-out examples (fewer than 10)" in r.getMessage() for r in caplog.records), caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainer.data.jsonl.build"):
        root.build(hf_tokenizer, root.write("enough.jsonl", rows), format="text", test_fraction=0.25)
    assert not any("held-out" in r.getMessage() for r in caplog.records), caplog.text


def test_the_start_record_carries_the_data_report(hf_tokenizer, root: DataRoot) -> None:
    dataset = root.build(hf_tokenizer, root.write("d.jsonl", '{"text": "a"}\n{"text": "b"}\n'), format="text")
    assert _data_report(dataset) == {"data": dataset.report}
    assert dataset.report == {
        "format": "text",
        "masking": "none",
        "rows": 2,
        "train_examples": 1,
        "held_out_examples": 1,
        "truncated": 0,
        "dropped_no_trainable_tokens": 0,
        "dropped_rows": {"train": 0, "held_out": 0},
        "trainable_tokens": 2,
        "label_names": None,
        "pad_token": {"id": hf_tokenizer.pad_token_id, "token": "<pad>", "source": "pad"},
    }


def test_a_tokenizer_without_a_pad_token_pads_with_eos_and_says_so(hf_tokenizer, root: DataRoot) -> None:
    """Issue 25 item 6: the EOS stood in for the missing pad token and nothing said so."""
    tokenizer = copy.deepcopy(hf_tokenizer)
    tokenizer.pad_token = None
    dataset = root.build(tokenizer, root.write("d.jsonl", '{"text": "a"}\n{"text": "b"}\n'), format="text")
    assert dataset.report["pad_token"] == {"id": tokenizer.eos_token_id, "token": "</s>", "source": "eos"}
    assert _data_report(build_text(TextConfig(max_bytes=2048))) == {}


CHATS = [
    {
        "messages": [
            {"role": "system", "content": "Be brief and kind to everyone."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello there, how are you?"},
        ]
    },
    {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]},
    {
        "messages": [
            {"role": "user", "content": "The quick brown fox"},
            {"role": "assistant", "content": "jumps"},
            {"role": "user", "content": "over?"},
            {"role": "assistant", "content": "the lazy dog."},
        ]
    },
    {"messages": [{"role": "user", "content": "Write a poem about the sea."}, {"role": "assistant", "content": "sky"}]},
    {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
]


class _CausalIgnoringMask(torch.nn.Module):
    """The built-in causal GPT taking the batch's attention mask: right padding follows every real token,
    so a causal model needs no mask for the real positions (the ``hf`` wrapper takes it the same way)."""

    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.gpt = gpt

    def forward(self, inputs: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.gpt(inputs)


def test_masked_chat_micro_batches_accumulate_to_the_full_batch_gradient(
    hf_tokenizer, root: DataRoot, cpu_ctx: DistContext, tiny_mlp_spec
) -> None:
    """C17 with the dataset's own masked, padded micro-batches (K=2, unequal trainable-token counts).

    The accumulated gradient equals the full-batch gradient normalised by the window's
    trainable targets only: masked prompt tokens and padding count neither in the loss
    nor in the normaliser.
    """
    dataset = root.build(hf_tokenizer, root.write("d.jsonl", _lines(CHATS)), format="chat", test_fraction=0.2)
    samples = dataset.train
    micro = [collate(samples[:1], dataset.pad_id, Task.LM), collate(samples[1:], dataset.pad_id, Task.LM)]
    full = collate(samples, dataset.pad_id, Task.LM)
    counts = [b.num_elements for b in micro]
    assert counts[0] != counts[1] and sum(counts) == full.num_elements == dataset.report["trainable_tokens"]
    assert full.attention_mask is not None
    real_targets = int(full.attention_mask.sum())  # one target per real input position
    assert full.num_elements < real_targets

    torch.manual_seed(0)
    model = _CausalIgnoringMask(
        GPT(vocab_size=len(hf_tokenizer), context=full.inputs.shape[1], n_layer=1, n_head=2, d_model=16)
    )
    loss_fn = task_loss(Task.LM)
    stats = accumulate_window(model, micro, build_precision(tiny_mlp_spec(), cpu_ctx.device), loss_fn, cpu_ctx)
    got = [grad_of(p).detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    reference_loss = loss_fn(model, full) / full.num_elements
    reference = torch.autograd.grad(reference_loss, list(model.parameters()))
    assert int(stats.num_elements) == full.num_elements
    for g, r in zip(got, reference, strict=True):
        torch.testing.assert_close(g, r, atol=1e-6, rtol=0)
    assert float(stats.loss) == pytest.approx(reference_loss.item(), abs=1e-6)

    # Normalising by every real target token (masked ones counted) would be off:
    wrong = torch.autograd.grad(loss_fn(model, full) / real_targets, list(model.parameters()))
    assert max((w - r).abs().max().item() for w, r in zip(wrong, reference, strict=True)) > 1e-4


def test_classification_truncates_to_max_seq_len_and_counts_it(hf_tokenizer, root: DataRoot) -> None:
    rows = [{"text": _words(10), "label": "long"}, {"text": "Hi", "label": "short"}, {"text": "fox", "label": "short"}]
    dataset = root.build(hf_tokenizer, root.write("d.jsonl", _lines(rows)), format="classification", max_seq_len=8)
    assert dataset.report["truncated"] == 1
    assert max(s.inputs.numel() for s in [*dataset.train, *dataset.held_out]) == 8


def test_with_the_eos_as_pad_token_the_eos_is_still_trained(hf_tokenizer, root: DataRoot) -> None:
    """A tokenizer without a pad token pads with its EOS; padding is masked by position, never by id, so
    every example's own closing EOS stays a trained target (masking by id would teach the model never
    to stop)."""
    import copy

    tokenizer = copy.deepcopy(hf_tokenizer)
    tokenizer.pad_token = None
    assert tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None
    rows = [
        {"instruction": "Say hi", "output": "Hi"},
        {"instruction": "Say more", "output": _words(3)},
        {"instruction": "x", "output": "fox"},
    ]
    dataset = root.build(tokenizer, root.write("d.jsonl", _lines(rows)), format="instruction", test_fraction=0.34)
    assert dataset.pad_id == tokenizer.eos_token_id
    batch = collate(dataset.train, dataset.pad_id, Task.LM)
    assert batch.attention_mask is not None and (batch.attention_mask == 0).any()  # some row is padded with EOS
    for row, sample in enumerate(dataset.train):
        last = int(sample.inputs.numel()) - 1
        assert batch.targets[row, last] == tokenizer.eos_token_id  # the example's own EOS: trained
        assert (batch.targets[row, last + 1 :] == IGNORE_INDEX).all()  # the EOS padding after it: not


def _mask(batch: Batch) -> torch.Tensor:
    """The attention mask of a padded batch (every jsonl batch has one)."""
    assert batch.attention_mask is not None
    return batch.attention_mask
