"""File datasets (``{"name": "jsonl"}``): JSON-lines or CSV rows tokenized with the model's tokenizer.

Modules, in the order the data flows: :mod:`.rows` (streaming rows with line numbers),
:mod:`.formats` (typed examples per format), :mod:`.tokens` and :mod:`.chat` (token
ids and trainable flags: the masking), :mod:`.samples` (truncation, drops, class ids),
:mod:`.batches` (sharded, padded micro-batches), :mod:`.build` (the builder).

:mod:`.rows` and :mod:`.formats` are torch-free: the API checks uploaded datasets with
them (``POST /datasets``), so it accepts exactly the rows the trainer reads. The
builder's names are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.data.jsonl.batches import TokenFileDataset
    from trainer.data.jsonl.build import build_jsonl

__all__ = ["TokenFileDataset", "build_jsonl"]

_HOMES = {"TokenFileDataset": "trainer.data.jsonl.batches", "build_jsonl": "trainer.data.jsonl.build"}


def __getattr__(name: str) -> Any:
    """The exported ``name``, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
