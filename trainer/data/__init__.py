"""Dataset registry: ``build_dataset(spec.dataset, tokenizer)`` gives the loop a :class:`Dataset`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer.catalog import DatasetSpec
from trainer.data.base import IGNORE_INDEX, Batch, DataInfo, Dataset, Task
from trainer.data.digits import build_digits
from trainer.data.synthetic import build_synthetic
from trainer.data.text import build_text

__all__ = ["IGNORE_INDEX", "Batch", "DataInfo", "Dataset", "Task", "build_dataset", "DATASETS"]

#: Registry name -> builder taking the entry's typed config.
DATASETS: dict[str, Callable[[Any], Dataset]] = {
    "digits": build_digits,
    "synthetic": build_synthetic,
    "text": build_text,
}


def build_dataset(spec: DatasetSpec, tokenizer: Any | None = None) -> Dataset:
    """The dataset named by ``spec`` (``{"name", "config"}`` from :mod:`trainer.catalog`).

    ``tokenizer``: the job's Hugging Face tokenizer (:func:`trainer.hf.loading.load_tokenizer`),
    or ``None`` for byte-level data (token ids are the bytes, vocabulary 256). The built-in
    datasets take none (``text`` is byte-level).

    Raises ``KeyError`` for a name without a builder (the catalog rejects those first)
    and :class:`trainer.errors.TrainerError` (``data_unavailable``) when the data
    cannot be read.
    """
    del tokenizer  # no built-in dataset is tokenized
    return DATASETS[spec.name](spec.config)
