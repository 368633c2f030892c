"""File datasets (``{"name": "jsonl"}``): JSON-lines or CSV rows tokenized with the model's tokenizer.

Modules, in the order the data flows: :mod:`.rows` (streaming rows with line numbers),
:mod:`.formats` (typed examples per format), :mod:`.tokens` and :mod:`.chat` (token
ids and trainable flags: the masking), :mod:`.samples` (truncation, drops, class ids),
:mod:`.batches` (sharded, padded micro-batches), :mod:`.build` (the builder).
"""

from __future__ import annotations

from trainer.data.jsonl.batches import TokenFileDataset
from trainer.data.jsonl.build import build_jsonl

__all__ = ["TokenFileDataset", "build_jsonl"]
