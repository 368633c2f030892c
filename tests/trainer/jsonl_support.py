"""Helpers for the ``jsonl`` dataset tests: a data root with files, the builder, and decoded trained spans."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from halfcast.contracts.catalog import JsonlDataset
from trainer.data import IGNORE_INDEX, build_dataset
from trainer.data.jsonl import TokenFileDataset


class DataRoot:
    """A data root (``HALFCAST_DATA_ROOTS``) to write dataset files into and build ``jsonl`` datasets from."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv("HALFCAST_DATA_ROOTS", str(path))

    def write(self, name: str, content: str | bytes) -> str:
        """Write ``content`` (text is written as UTF-8, newlines untranslated) to ``name``; return ``name``."""
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode() if isinstance(content, str) else content)
        return name

    def build(self, tokenizer: Any, path: str, **config: Any) -> TokenFileDataset:
        """``build_dataset`` of the ``jsonl`` entry reading ``path`` with ``config``."""
        spec = JsonlDataset(name="jsonl", config={"path": path, **config})
        dataset = build_dataset(spec, tokenizer)
        assert isinstance(dataset, TokenFileDataset)
        return dataset


def trained_spans(tokenizer: Any, targets: torch.Tensor) -> list[str]:
    """The decoded runs of consecutive trainable targets of one row (``targets [T]``)."""
    spans: list[list[int]] = []
    previous = False
    for value in targets.tolist():
        trainable = value != IGNORE_INDEX
        if trainable and not previous:
            spans.append([])
        if trainable:
            spans[-1].append(value)
        previous = trainable
    return [tokenizer.decode(span) for span in spans]


def every_sample(dataset: TokenFileDataset) -> list[Any]:
    """Training then held-out samples."""
    return [*dataset.train, *dataset.held_out]
