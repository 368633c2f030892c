"""The ``jsonl`` dataset: a data file's rows, split, tokenized, truncated and batched.

The rows are split once, before tokenizing: a permutation from ``split_seed`` holds
out ``round(rows * test_fraction)`` of them (at least one); both splits keep file order.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch

from halfcast.contracts.catalog import JsonlConfig
from halfcast.contracts.records import HELD_OUT_MINIMUM
from halfcast.contracts.status import FailureReason
from trainer.data.base import DataInfo, Task
from trainer.data.jsonl.batches import Sample, TokenFileDataset
from trainer.data.jsonl.chat import chat_tokens, check_chat_template
from trainer.data.jsonl.formats import (
    ChatExample,
    ClassificationExample,
    Example,
    InstructionExample,
    TextExample,
    parse_row,
)
from trainer.data.jsonl.rows import rows_of
from trainer.data.jsonl.samples import SplitCounts, class_labels, classification_sample, lm_sample
from trainer.data.jsonl.source import open_dataset
from trainer.data.jsonl.tokens import (
    TokenExample,
    classification_ids,
    eos_id,
    instruction_tokens,
    leading_special_ids,
    text_tokens,
)
from trainer.errors import TrainerError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


def build_jsonl(config: JsonlConfig, tokenizer: PreTrainedTokenizerBase | None) -> TokenFileDataset:
    """The dataset of ``config``'s file, tokenized with ``tokenizer`` (the model's).

    Raises :class:`TrainerError`: ``spec_invalid`` without a tokenizer (or one lacking
    what the format needs: EOS, a pad or EOS id, a chat template); ``data_unavailable``
    for a file outside the data roots, too large, malformed (naming file, line and
    field), or too small to split.
    """
    if tokenizer is None:
        raise TrainerError(
            FailureReason.SPEC_INVALID, "dataset 'jsonl' needs the model's tokenizer (use a model that has one)"
        )
    if not config.resolved:
        raise TrainerError(
            FailureReason.SPEC_INVALID, f"{config.source} was not resolved by the worker (format, file_format, sha256)"
        )
    pad_id = _pad_id(tokenizer)
    _check_tokenizer(config, tokenizer)
    examples = _read_examples(config)
    splits = split_rows(len(examples), config.test_fraction, config.split_seed, config.source)
    if config.format == "classification":
        dataset = _classification(config, tokenizer, cast(list[ClassificationExample], examples), splits, pad_id)
    else:
        dataset = _language_model(config, tokenizer, examples, splits, pad_id)
    dataset.report["pad_token"] = pad_token_report(tokenizer, pad_id)
    _log_report(config, dataset.report)
    return dataset


def _pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise TrainerError(
            FailureReason.SPEC_INVALID, "the tokenizer has neither a pad nor an EOS token to pad batches with"
        )
    return int(pad)


def pad_token_report(tokenizer: PreTrainedTokenizerBase, pad_id: int) -> dict[str, object]:
    """What the batches are padded with: ``{"id", "token", "source"}``, ``source`` ``pad`` (the tokenizer's own pad
    token) or ``eos`` (it has none: the EOS pads, and is masked out of the loss like any padding)."""
    source = "pad" if tokenizer.pad_token_id is not None else "eos"
    return {"id": pad_id, "token": tokenizer.convert_ids_to_tokens(pad_id), "source": source}


def _check_tokenizer(config: JsonlConfig, tokenizer: PreTrainedTokenizerBase) -> None:
    """Fail before reading the file when the tokenizer lacks what the format needs."""
    if config.format == "chat":
        check_chat_template(tokenizer)
    elif config.format != "classification":
        eos_id(tokenizer)


def _read_examples(config: JsonlConfig) -> list[Example]:
    with open_dataset(config) as handle:
        file_format, fmt = config.effective_file_format, cast(str, config.format)  # resolved: open_dataset checks
        rows = rows_of(config.source, handle, file_format)
        return [parse_row(row, fmt, config.column_map, csv=file_format == "csv") for row in rows]


def split_rows(count: int, test_fraction: float, split_seed: int, file: str) -> tuple[list[int], list[int]]:
    """Row indices ``(train, held_out)``, each in file order; ``data_unavailable`` if either would be empty."""
    held = max(1, round(count * test_fraction))
    if count - held < 1:
        msg = f"dataset file {file!r} has {count} rows: too few to hold out test_fraction {test_fraction} and train"
        raise TrainerError(FailureReason.DATA_UNAVAILABLE, msg)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(split_seed)).tolist()
    return sorted(order[held:]), sorted(order[:held])


def _language_model(
    config: JsonlConfig,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    splits: tuple[list[int], list[int]],
    pad_id: int,
) -> TokenFileDataset:
    masking = config.effective_masking or "none"
    prefix = leading_special_ids(tokenizer)

    def tokens(example: Example) -> TokenExample:
        if isinstance(example, TextExample):
            return text_tokens(example, tokenizer, prefix)
        if isinstance(example, InstructionExample):
            return instruction_tokens(example, tokenizer, prefix, masking)
        return chat_tokens(cast(ChatExample, example), tokenizer, masking, config.source)

    counts = (SplitCounts(), SplitCounts())
    samples: tuple[list[Sample], list[Sample]] = ([], [])
    for rows, split_counts, split_samples in zip(splits, counts, samples, strict=True):
        for index in rows:
            sample = lm_sample(tokens(examples[index]), config.max_seq_len, split_counts)
            if sample is not None:
                split_samples.append(sample)
    _check_not_empty(config, counts)
    info = DataInfo(task=Task.LM, num_outputs=len(tokenizer), seq_len=config.max_seq_len)
    return TokenFileDataset(info, samples[0], samples[1], pad_id, report(config, len(examples), counts, None))


def _classification(
    config: JsonlConfig,
    tokenizer: PreTrainedTokenizerBase,
    examples: list[ClassificationExample],
    splits: tuple[list[int], list[int]],
    pad_id: int,
) -> TokenFileDataset:
    labels = class_labels(examples, config.source)
    counts = (SplitCounts(), SplitCounts())
    samples: tuple[list[Sample], list[Sample]] = ([], [])
    for rows, split_counts, split_samples in zip(splits, counts, samples, strict=True):
        for index in rows:
            ids, truncated = classification_ids(examples[index].text, tokenizer, config.max_seq_len)
            split_samples.append(classification_sample(ids, labels.ids[index], truncated, split_counts))
    names = tuple(labels.names) if labels.names is not None else None
    info = DataInfo(Task.CLASSIFICATION, labels.num_labels, seq_len=config.max_seq_len, label_names=names)
    return TokenFileDataset(info, samples[0], samples[1], pad_id, report(config, len(examples), counts, labels.names))


def _check_not_empty(config: JsonlConfig, counts: tuple[SplitCounts, SplitCounts]) -> None:
    for name, split in zip(("training", "held-out"), counts, strict=True):
        if split.examples == 0:
            msg = (
                f"dataset file {config.source!r}: no {name} example has a trainable token left "
                f"({split.dropped_no_trainable_tokens} dropped after truncation to max_seq_len {config.max_seq_len})"
            )
            raise TrainerError(FailureReason.DATA_UNAVAILABLE, msg)


def report(
    config: JsonlConfig, rows: int, counts: tuple[SplitCounts, SplitCounts], label_names: list[str] | None
) -> dict[str, object]:
    """The build's counts for the ``start`` record (truncated and dropped: both splits together)."""
    train, held = counts
    return {
        "format": config.format,
        "masking": config.effective_masking,
        "rows": rows,
        "train_examples": train.examples,
        "held_out_examples": held.examples,
        "truncated": train.truncated + held.truncated,
        "dropped_no_trainable_tokens": train.dropped_no_trainable_tokens + held.dropped_no_trainable_tokens,
        "dropped_rows": {"train": train.dropped_no_trainable_tokens, "held_out": held.dropped_no_trainable_tokens},
        "trainable_tokens": train.trainable_tokens,
        "label_names": label_names,
    }


def _log_report(config: JsonlConfig, summary: dict[str, object]) -> None:
    log.info("dataset %s: %s", config.source, summary)
    held_out = cast(int, summary["held_out_examples"])
    if held_out < HELD_OUT_MINIMUM:
        log.warning(
            "dataset %s: only %d held-out examples (fewer than %d): its evaluation metrics are noisy; "
            "raise test_fraction or add rows",
            config.source,
            held_out,
            HELD_OUT_MINIMUM,
        )
    if summary["truncated"] or summary["dropped_no_trainable_tokens"]:
        log.warning(
            "dataset %s: %s examples truncated to max_seq_len %d, %s dropped without a trainable token",
            config.source,
            summary["truncated"],
            config.max_seq_len,
            summary["dropped_no_trainable_tokens"],
        )
