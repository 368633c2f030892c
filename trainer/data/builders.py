"""The dataset builders: ``build_dataset(spec.dataset, tokenizer)`` gives the loop a :class:`Dataset`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from halfcast.contracts.catalog import DatasetSpec
from trainer.data.base import Dataset
from trainer.data.digits import build_digits
from trainer.data.jsonl.build import build_jsonl
from trainer.data.synthetic import build_synthetic
from trainer.data.text import build_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["DATASETS", "build_dataset"]

#: ``builder(config, tokenizer)``: the entry's typed config and the model's tokenizer (or ``None``).
Builder = Callable[[Any, "PreTrainedTokenizerBase | None"], Dataset]


def _without_tokenizer(build: Callable[[Any], Dataset]) -> Builder:
    """A builder of data that needs no tokenizer (it ignores the one it is given)."""

    def builder(config: Any, tokenizer: PreTrainedTokenizerBase | None) -> Dataset:
        return build(config)

    builder.__doc__ = build.__doc__
    return builder


#: Registry name -> builder taking the entry's typed config and the tokenizer.
DATASETS: dict[str, Builder] = {
    "digits": _without_tokenizer(build_digits),
    "synthetic": _without_tokenizer(build_synthetic),
    "text": _without_tokenizer(build_text),
    "jsonl": build_jsonl,
}


def build_dataset(spec: DatasetSpec, tokenizer: PreTrainedTokenizerBase | None = None) -> Dataset:
    """The dataset named by ``spec`` (``{"name", "config"}`` from :mod:`halfcast.contracts.catalog`).

    ``tokenizer``: the model's tokenizer, for token datasets read from files (``jsonl``
    requires one; the others ignore it). Raises ``KeyError`` for a name without a
    builder (the catalog rejects those first) and :class:`trainer.errors.TrainerError`
    (``data_unavailable`` when the data cannot be read, ``spec_invalid`` when ``jsonl``
    gets no tokenizer).
    """
    return DATASETS[spec.name](spec.config, tokenizer)
