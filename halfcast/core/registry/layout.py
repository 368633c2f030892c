"""Where registered files live under ``<data_dir>/registry``, and the staging and trash folders beside them.

``datasets/<sha256>.<jsonl|csv>`` and ``models/<id>/`` (names from :mod:`trainer.registered`, so the
trainer finds what the API stored). Uploads are written to ``.staging/`` first and renamed into place
only once accepted; deletions rename into ``.trash/`` before their transaction commits. Both folders
are on the same filesystem as the registry, so every rename is atomic.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from trainer.registered import DATASETS_DIR, MODELS_DIR, dataset_file_name

STAGING_DIR, TRASH_DIR = ".staging", ".trash"


@dataclass(frozen=True)
class RegistryLayout:
    """The registry directory ``root`` and the paths under it."""

    root: Path

    @property
    def datasets(self) -> Path:
        return self.root / DATASETS_DIR

    @property
    def models(self) -> Path:
        return self.root / MODELS_DIR

    def dataset_file(self, sha256: str, file_format: str) -> Path:
        """The content-addressed file of a dataset."""
        return self.datasets / dataset_file_name(sha256, file_format)

    def model_dir(self, model_id: str) -> Path:
        return self.models / model_id

    def staging_path(self, suffix: str = "") -> Path:
        """A fresh path under ``.staging/`` (the folders created): an upload's file or directory."""
        for folder in (self.root / STAGING_DIR, self.datasets, self.models):
            folder.mkdir(parents=True, exist_ok=True)
        return self.root / STAGING_DIR / f"{uuid.uuid4().hex}{suffix}"

    def trash_path(self) -> Path:
        """A fresh path under ``.trash/`` (created)."""
        folder = self.root / TRASH_DIR
        folder.mkdir(parents=True, exist_ok=True)
        return folder / uuid.uuid4().hex


def remove_path(path: Path) -> None:
    """Remove a file or a directory tree at ``path`` if there is one (never following a link)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
