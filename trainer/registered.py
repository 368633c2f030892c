"""Registered datasets and models (``POST /datasets``, ``POST /models``): where they live. Torch-free.

The API keeps what was uploaded (or registered from a job's export) under the registry
directory, ``<data_dir>/registry``, which the workers share with it as they share the
runs directory:

- ``datasets/<sha256>.<jsonl|csv>``: a dataset file, named by the SHA-256 of its bytes
  (two uploads of the same bytes share one file);
- ``models/<model_id>/``: a Hugging Face model directory (``config.json``, ``*.safetensors``,
  tokenizer files).

A job names them by id (``dataset.config.dataset_id``, ``model.config.model_id``). The
worker fills in a dataset's ``format``, ``file_format`` and ``sha256`` from the database
before the run (the stored spec stays as submitted) and passes the directory to the
trainer as ``HALFCAST_REGISTRY_DIR``. The trainer finds the files here and checks a
dataset's SHA-256 before it reads a row (``data_unavailable`` on a mismatch).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import BinaryIO

from halfcast.contracts.status import FailureReason
from trainer.errors import TrainerError

#: The variable the worker sets to the registry directory for the run.
REGISTRY_DIR_ENV = "HALFCAST_REGISTRY_DIR"
#: Sub-directories of the registry directory.
DATASETS_DIR, MODELS_DIR = "datasets", "models"
#: Bytes read at a time when hashing.
HASH_CHUNK = 1 << 20


def dataset_file_name(sha256: str, file_format: str) -> str:
    """The name of a registered dataset file: ``<sha256>.<file_format>`` (``jsonl`` or ``csv``)."""
    return f"{sha256}.{file_format}"


def registry_dir(reason: FailureReason) -> Path:
    """``HALFCAST_REGISTRY_DIR``; ``reason`` (``data_unavailable``, ``model_unavailable``) when it is unset."""
    raw = os.environ.get(REGISTRY_DIR_ENV, "")
    if not raw:
        raise TrainerError(reason, f"no registry directory is configured ({REGISTRY_DIR_ENV} is empty)")
    return Path(raw)


def _regular(path: Path, reason: FailureReason, what: str) -> Path:
    """``path`` when it is a regular file (not a link), else ``reason``."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        raise TrainerError(reason, f"{what} is missing from the registry ({path.name})") from None
    if not stat.S_ISREG(mode):
        raise TrainerError(reason, f"{what} in the registry is not a regular file ({path.name})")
    return path


def registered_dataset_file(dataset_id: str, sha256: str, file_format: str) -> Path:
    """The file of registered dataset ``dataset_id`` (``data_unavailable`` when it is not there)."""
    path = registry_dir(FailureReason.DATA_UNAVAILABLE) / DATASETS_DIR / dataset_file_name(sha256, file_format)
    return _regular(path, FailureReason.DATA_UNAVAILABLE, f"the file of dataset {dataset_id}")


def registered_model_dir(model_id: str) -> Path:
    """The directory of registered model ``model_id`` (``model_unavailable`` when it is not there or is a link)."""
    path = registry_dir(FailureReason.MODEL_UNAVAILABLE) / MODELS_DIR / model_id
    try:
        mode = path.lstat().st_mode
    except OSError:
        raise TrainerError(FailureReason.MODEL_UNAVAILABLE, f"model {model_id} is missing from the registry") from None
    if not stat.S_ISDIR(mode):
        raise TrainerError(FailureReason.MODEL_UNAVAILABLE, f"model {model_id} in the registry is not a directory")
    return path


def stream_sha256(handle: BinaryIO) -> str:
    """SHA-256 (hex) of everything left in ``handle``."""
    digest = hashlib.sha256()
    while chunk := handle.read(HASH_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def check_sha256(handle: BinaryIO, expected: str, name: str) -> None:
    """Hash the open file ``handle`` from its start, then rewind it; ``data_unavailable`` when it is not ``expected``."""
    handle.seek(0)
    actual = stream_sha256(handle)
    handle.seek(0)
    if actual != expected:
        msg = f"{name} has SHA-256 {actual}, not the expected {expected}: the file changed after it was registered"
        raise TrainerError(FailureReason.DATA_UNAVAILABLE, msg)
