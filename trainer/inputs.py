"""Fingerprints of the files a job reads (an ``hf`` model directory, a separate tokenizer directory, a
``jsonl`` data file), kept in every checkpoint so a resume never continues on other inputs.

A base model replaced in place under the model root (another fine-tune of the same architecture, a
re-download of a newer revision), or a data file edited between attempts, would let an adapter
checkpoint load without an error onto weights it was not trained against, or shift every sample after
the resume point: the continuation would silently differ from the run it claims to continue. The
checkpoint stores :func:`input_fingerprints`; :func:`check_inputs_unchanged` refuses a resume whose
files now fingerprint differently (``model_unavailable`` / ``data_unavailable``, naming the input).

A file's fingerprint is the SHA-256 of its size and content; files over :data:`WHOLE_FILE_BYTES` hash
their first and last :data:`EDGE_BYTES` only (a safetensors file's header and its first and last
tensors), so a multi-GB model costs a few MiB of reads. Neither paths nor modification times count:
the same files copied to another host (or a later attempt's mount) fingerprint the same.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from halfcast.contracts.spec import JobSpec
from halfcast.contracts.status import FailureReason
from trainer.errors import TrainerError

#: Checkpoint entry holding :func:`input_fingerprints`.
INPUTS_KEY: Final = "inputs"
#: Files up to this size are hashed whole.
WHOLE_FILE_BYTES = 16 << 20
#: Bytes hashed at each end of a larger file.
EDGE_BYTES = 1 << 20
#: The failure reason when each input changed.
_REASONS: dict[str, FailureReason] = {
    "model": FailureReason.MODEL_UNAVAILABLE,
    "tokenizer": FailureReason.MODEL_UNAVAILABLE,
    "data": FailureReason.DATA_UNAVAILABLE,
}


def file_fingerprint(path: Path) -> str:
    """SHA-256 (hex) of ``path``'s size and content (both ends only for files over :data:`WHOLE_FILE_BYTES`)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        digest.update(size.to_bytes(8, "little"))
        if size <= WHOLE_FILE_BYTES:
            digest.update(handle.read())
        else:
            digest.update(handle.read(EDGE_BYTES))
            handle.seek(size - EDGE_BYTES)
            digest.update(handle.read(EDGE_BYTES))
    return digest.hexdigest()


def directory_fingerprint(directory: Path) -> str:
    """SHA-256 (hex) over the names and :func:`file_fingerprint` of ``directory``'s regular, non-hidden
    files (top level, in name order): a model directory's config, weights and tokenizer files."""
    digest = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        digest.update(path.name.encode() + b"\0" + file_fingerprint(path).encode() + b"\n")
    return digest.hexdigest()


def input_fingerprints(spec: JobSpec) -> dict[str, str]:
    """``{"model", "tokenizer", "data"}`` fingerprints of the files ``spec`` reads (only those it has).

    Raises what resolving the paths raises (``model_unavailable``, ``data_unavailable``).
    """
    out: dict[str, str] = {}
    if spec.model.name == "hf":
        from trainer.hf.loading import model_dir, tokenizer_dir

        config = spec.model.config
        directory = model_dir(config)
        if directory is not None:
            out["model"] = directory_fingerprint(directory)
        if config.tokenizer_path is not None:
            out["tokenizer"] = directory_fingerprint(tokenizer_dir(config))  # type: ignore[arg-type]
    if spec.dataset.name == "jsonl":
        from trainer.data.jsonl.source import dataset_path

        out["data"] = file_fingerprint(dataset_path(spec.dataset.config))
    return out


def check_inputs_unchanged(saved: Mapping[str, str] | None, spec: JobSpec, path: Path) -> None:
    """Refuse to resume from checkpoint ``path`` when an input it was trained on now fingerprints differently.

    ``saved``: the checkpoint's :data:`INPUTS_KEY` entry (``None`` for checkpoints written before it
    existed: nothing to compare). Raises :class:`TrainerError` (``model_unavailable`` for the model or
    tokenizer, ``data_unavailable`` for the data file), naming what changed.
    """
    if saved is None:
        return
    current = input_fingerprints(spec)
    changed = [name for name in ("model", "tokenizer", "data") if saved.get(name) != current.get(name)]
    if not changed:
        return
    msg = (
        f"cannot resume from {path}: the {' and '.join(changed)} changed since the checkpoint was written "
        "(different files under the model or data roots); resuming would continue on other inputs than "
        "the run trained on"
    )
    raise TrainerError(_REASONS[changed[0]], msg)
