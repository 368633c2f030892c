"""The data file of a ``jsonl`` dataset, opened: a file under a data root or a registered dataset. Torch-free.

Either way the file must be a non-empty regular file of at most ``max_bytes``; when the
config has a ``sha256`` (always for a registered dataset: the worker fills it in), the
file's bytes must hash to it, checked before a row is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from halfcast.contracts.catalog import JsonlConfig
from halfcast.contracts.status import FailureReason
from trainer.data.sources import open_bounded, resolve_data_file
from trainer.errors import TrainerError
from trainer.registered import check_sha256, registered_dataset_file


def dataset_path(config: JsonlConfig) -> Path:
    """Where the config's file is (``data_unavailable`` when it cannot be found or is not resolved)."""
    if config.path is not None:
        return resolve_data_file(config.path)
    if not config.resolved or config.dataset_id is None or config.sha256 is None:
        raise TrainerError(
            FailureReason.SPEC_INVALID, f"{config.source} was not resolved by the worker (format, file_format, sha256)"
        )
    return registered_dataset_file(config.dataset_id, config.sha256, config.effective_file_format)


def open_dataset(config: JsonlConfig) -> BinaryIO:
    """The config's file opened for reading, size-bounded and its SHA-256 checked (:class:`~trainer.errors.TrainerError`)."""
    handle = open_bounded(dataset_path(config), config.source, config.max_bytes)
    try:
        if config.sha256 is not None:
            check_sha256(handle, config.sha256, config.source)
    except BaseException:
        handle.close()
        raise
    return handle
