"""A model directory checked as the trainer will check it, and summarised (model type, files, bytes, digest).

For an uploaded model (after :mod:`.model_archive` extracted it) and for a job's exported model
being registered: every entry must be a regular file or a directory (no links: walked with
``lstat``), no pickle file anywhere, at most :data:`MAX_FILES` files; ``config.json`` must be a
JSON object of at most :data:`MAX_CONFIG_BYTES` naming a ``model_type`` of
:data:`trainer.hf.model_types.REGISTRY_MODEL_TYPES`, and neither it nor ``tokenizer_config.json``
may ask for remote code; the top level must hold ``*.safetensors`` weights, and every
``*.safetensors`` file must have a well-formed header that matches its size
(:mod:`.safetensors_header`: a renamed pickle is refused here, not by the job). The remote-code and
weights rules are the trainer's own (:mod:`trainer.hf.safety`). Blocking: run it in a worker thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from server.registry.model_archive import (
    MAX_DEPTH,
    MAX_MEMBERS,
    PICKLE_SUFFIXES,
    ArchiveRejected,
)
from server.registry.safetensors_header import WeightsRejected, check_safetensors
from trainer.hf.model_types import REGISTRY_MODEL_TYPES
from trainer.hf.safety import (
    CONFIG_FILE,
    TOKENIZER_CONFIG_FILE,
    remote_code_problem,
    weights_problem,
)
from trainer.registered import stream_sha256

#: Largest ``config.json`` / ``tokenizer_config.json`` read.
MAX_CONFIG_BYTES = 1 << 20
#: Most files a registered model may hold.
MAX_FILES = MAX_MEMBERS


@dataclass(frozen=True)
class ModelSummary:
    """A checked model directory: its ``model_type``, regular ``files``, their ``bytes``, and ``sha256``
    (over the sorted relative names and each file's SHA-256)."""

    model_type: str
    files: int
    bytes: int
    sha256: str


def _files(directory: Path) -> dict[str, Path]:
    """Every regular file under ``directory`` by its relative ``/`` name; :class:`ArchiveRejected` for anything else."""
    found: dict[str, Path] = {}
    stack = [(directory, 0)]
    while stack:
        folder, depth = stack.pop()
        for entry in os.scandir(folder):
            path = Path(entry.path)
            name = path.relative_to(directory).as_posix()
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                if depth >= MAX_DEPTH:
                    raise ArchiveRejected(f"{name!r} is nested deeper than {MAX_DEPTH} directories", name)
                stack.append((path, depth + 1))
            elif not stat.S_ISREG(mode):
                raise ArchiveRejected(f"{name!r} is a link or a special file", name)
            elif PurePosixPath(name).suffix.lower() in PICKLE_SUFFIXES:
                raise ArchiveRejected(f"{name!r}: pickle files are refused (use *.safetensors weights)", name)
            else:
                found[name] = path
            if len(found) > MAX_FILES:
                raise ArchiveRejected(f"more than {MAX_FILES} files")
    return found


def _json_object(path: Path, name: str) -> dict[str, object]:
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ArchiveRejected(f"{name} is over {MAX_CONFIG_BYTES} bytes", name)
    try:
        data = json.loads(path.read_bytes())
    except RecursionError:
        raise ArchiveRejected(f"{name} is not valid JSON: nested too deep", name) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArchiveRejected(f"{name} is not valid JSON: {exc}", name) from None
    if not isinstance(data, dict):
        raise ArchiveRejected(f"{name} is not a JSON object", name)
    return data


def _model_type(files: dict[str, Path]) -> str:
    if CONFIG_FILE not in files:
        raise ArchiveRejected(f"the model has no {CONFIG_FILE}", CONFIG_FILE)
    config = _json_object(files[CONFIG_FILE], CONFIG_FILE)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in REGISTRY_MODEL_TYPES:
        supported = ", ".join(sorted(REGISTRY_MODEL_TYPES))
        raise ArchiveRejected(
            f"{CONFIG_FILE}: model_type {model_type!r} is not supported (supported: {supported})", CONFIG_FILE
        )
    for name in (CONFIG_FILE, TOKENIZER_CONFIG_FILE):
        data = config if name == CONFIG_FILE else (_json_object(files[name], name) if name in files else {})
        problem = remote_code_problem(data, name)
        if problem is not None:
            raise ArchiveRejected(f"the model {problem}", name)
    return model_type


def _check_weights(files: dict[str, Path]) -> None:
    """Every ``*.safetensors`` file's header parsed and checked against its size (no tensor is loaded)."""
    for name, path in sorted(files.items()):
        if PurePosixPath(name).suffix.lower() != ".safetensors":
            continue
        try:
            check_safetensors(path)
        except WeightsRejected as exc:
            raise ArchiveRejected(f"{name} {exc}", name) from None


def _digest(files: dict[str, Path]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        with files[name].open("rb") as handle:
            digest.update(name.encode() + b"\0" + stream_sha256(handle).encode() + b"\n")
    return digest.hexdigest()


def summarise_model_dir(directory: Path) -> ModelSummary:
    """The :class:`ModelSummary` of the model directory ``directory``; :class:`ArchiveRejected` when it is refused."""
    files = _files(directory)
    model_type = _model_type(files)
    problem = weights_problem(name for name in files if "/" not in name)
    if problem is not None:
        raise ArchiveRejected(f"the model {problem}")
    _check_weights(files)
    size = sum(path.stat().st_size for path in files.values())
    return ModelSummary(model_type=model_type, files=len(files), bytes=size, sha256=_digest(files))
