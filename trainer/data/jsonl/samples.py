"""Examples to samples: truncation to ``max_seq_len`` (counted), the zero-trainable drop, class ids.

Nothing is cut or dropped silently: :class:`SplitCounts` tallies truncated examples
and examples left without a trainable token (dropped: they would only add padding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainer.data.base import IGNORE_INDEX
from trainer.data.jsonl.batches import Sample
from trainer.data.jsonl.formats import ClassificationExample, LabelCheck
from trainer.data.jsonl.tokens import TokenExample


@dataclass
class SplitCounts:
    """What happened to one split's examples on the way to samples."""

    examples: int = 0
    truncated: int = 0
    dropped_no_trainable_tokens: int = 0
    trainable_tokens: int = 0


def lm_sample(example: TokenExample, max_seq_len: int, counts: SplitCounts) -> Sample | None:
    """Inputs ``ids[:-1]`` and targets ``ids[1:]`` (:data:`IGNORE_INDEX` where not trainable), at most ``max_seq_len``.

    An example longer than ``max_seq_len + 1`` tokens is cut (counted); one left with no
    trainable target is dropped (counted, ``None``).
    """
    if len(example.ids) > max_seq_len + 1:
        counts.truncated += 1
        example = example.truncated(max_seq_len + 1)
    trainable = example.num_trainable
    if trainable == 0:
        counts.dropped_no_trainable_tokens += 1
        return None
    ids = torch.tensor(example.ids, dtype=torch.int64)
    keep = torch.tensor(example.trainable[1:], dtype=torch.bool)
    targets = torch.where(keep, ids[1:], torch.full_like(ids[1:], IGNORE_INDEX))
    counts.examples += 1
    counts.trainable_tokens += trainable
    return Sample(inputs=ids[:-1].clone(), targets=targets)


def classification_sample(ids: list[int], label: int, truncated: bool, counts: SplitCounts) -> Sample:
    """The (already truncated: :func:`trainer.data.jsonl.tokens.classification_ids`) ids and the class id;
    a cut is counted."""
    counts.truncated += int(truncated)
    counts.examples += 1
    return Sample(inputs=torch.tensor(ids, dtype=torch.int64), targets=torch.tensor(label, dtype=torch.int64))


@dataclass(frozen=True)
class Labels:
    """Class ids of the examples (in order), their count, and the class names (``None`` for integer labels)."""

    ids: list[int]
    num_labels: int
    names: list[str] | None


def class_labels(examples: Sequence[ClassificationExample], file: str) -> Labels:
    """Integer labels as given (``num_labels = max + 1``), or names mapped to ids in sorted order.

    Raises ``data_unavailable`` at the first row whose label kind (integer or name)
    differs from the first row's, or when only one class occurs.
    """
    check = LabelCheck(file)
    for example in examples:
        check.add(example)
    check.finish()
    if check.integers:
        ids = [int(example.label) for example in examples]
        names, count = None, max(ids) + 1
    else:
        names = sorted({str(example.label) for example in examples})
        index = {name: number for number, name in enumerate(names)}
        ids, count = [index[str(example.label)] for example in examples], len(names)
    return Labels(ids, count, names)
