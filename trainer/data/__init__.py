"""Datasets: ``build_dataset(spec.dataset, tokenizer)`` gives the loop a :class:`Dataset`.

The names are loaded on first use (:func:`__getattr__`): importing a torch-free module of
this package (:mod:`trainer.data.sources`, :mod:`trainer.data.jsonl.rows`,
:mod:`trainer.data.jsonl.formats`, which the API uses to check uploaded datasets) does not
import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.data.base import IGNORE_INDEX, Batch, DataInfo, Dataset, Task
    from trainer.data.builders import DATASETS, build_dataset

__all__ = ["DATASETS", "IGNORE_INDEX", "Batch", "DataInfo", "Dataset", "Task", "build_dataset"]

#: Where each exported name lives.
_HOMES = {
    "IGNORE_INDEX": "trainer.data.base",
    "Batch": "trainer.data.base",
    "DataInfo": "trainer.data.base",
    "Dataset": "trainer.data.base",
    "Task": "trainer.data.base",
    "DATASETS": "trainer.data.builders",
    "build_dataset": "trainer.data.builders",
}


def __getattr__(name: str) -> Any:
    """The exported ``name``, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
