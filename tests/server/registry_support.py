"""Helpers of the registry tests (imported as ``registry_support``): dataset files, model directories and tars.

Model directories are built without torch: a ``config.json``, a tokenizer config and a minimal
valid safetensors file (an 8-byte header length, a JSON header, the tensor bytes). Tars are built
in memory with any entry kind, so the tests can send what ``tarfile`` itself would refuse to extract.
"""

from __future__ import annotations

import io
import json
import struct
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db.models import AuditEvent, RegisteredDataset, RegisteredModel

CHAT_ROWS = [
    {"messages": [{"role": "user", "content": f"What is {n} plus 1?"}, {"role": "assistant", "content": f"{n + 1}."}]}
    for n in range(6)
]
LLAMA_CONFIG: dict[str, Any] = {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "vocab_size": 16}


def jsonl(rows: Iterable[Any]) -> bytes:
    """Rows as JSON lines."""
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def safetensors_bytes(data_bytes: int | None = None) -> bytes:
    """A valid safetensors file holding one float32 tensor of one element (or one uint8 tensor of ``data_bytes``)."""
    if data_bytes is not None:
        header = json.dumps({"w": {"dtype": "U8", "shape": [data_bytes], "data_offsets": [0, data_bytes]}}).encode()
        return struct.pack("<Q", len(header)) + header + b"\0" * data_bytes
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    return struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0)


def model_files(config: dict[str, Any] | None = None, **extra: bytes) -> dict[str, bytes]:
    """The files of a minimal model directory (``config.json``, weights, tokenizer config), plus ``extra``."""
    files = {
        "config.json": json.dumps(config or LLAMA_CONFIG).encode(),
        "model.safetensors": safetensors_bytes(),
        "tokenizer_config.json": b'{"model_max_length": 64}',
    }
    files.update({name.replace("__", "/"): data for name, data in extra.items()})
    return files


@dataclass(frozen=True)
class Entry:
    """One tar entry: ``name``, a ``kind`` (``tarfile.REGTYPE``, ``SYMTYPE``, ...), file ``data`` or a link ``target``."""

    name: str
    data: bytes = b""
    kind: bytes = tarfile.REGTYPE
    target: str = ""


def tar_of(entries: Iterable[Entry]) -> bytes:
    """An uncompressed tar of ``entries``, whatever they are."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.type = entry.kind
            info.linkname = entry.target
            info.mode = 0o755 if entry.kind == tarfile.DIRTYPE else 0o644
            info.size = len(entry.data) if entry.kind == tarfile.REGTYPE else 0
            archive.addfile(info, io.BytesIO(entry.data) if entry.kind == tarfile.REGTYPE else None)
    return buffer.getvalue()


def model_tar(files: dict[str, bytes] | None = None, prefix: str = "", extra: Iterable[Entry] = ()) -> bytes:
    """A tar of a model directory's ``files`` (default :func:`model_files`), under ``prefix/`` if given."""
    chosen = files if files is not None else model_files()
    lead = f"{prefix}/" if prefix else ""
    return tar_of([*(Entry(lead + name, data) for name, data in chosen.items()), *extra])


def write_model_dir(directory: Path, files: dict[str, bytes] | None = None) -> Path:
    """Write a model directory (default :func:`model_files`)."""
    for name, data in (files if files is not None else model_files()).items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    return directory


def registry_counts(sessions: sessionmaker[Session]) -> tuple[int, int]:
    """Rows of ``datasets`` and ``models``."""
    with sessions() as session:
        return (
            int(session.scalar(select(func.count()).select_from(RegisteredDataset)) or 0),
            int(session.scalar(select(func.count()).select_from(RegisteredModel)) or 0),
        )


def stored_files(registry: Path) -> list[str]:
    """Every file and directory under the registry directory but the empty staging and trash folders, sorted."""
    return sorted(
        p.relative_to(registry).as_posix()
        for p in registry.rglob("*")
        if p.name not in (".staging", ".trash", "datasets", "models")
    )


def audit_actions(sessions: sessionmaker[Session], prefix: str) -> list[tuple[str, str, str]]:
    """``(action, actor, subject)`` of the audit events whose action starts with ``prefix``, oldest first."""
    with sessions() as session:
        rows = session.scalars(select(AuditEvent).where(AuditEvent.action.startswith(prefix)).order_by(AuditEvent.id))
        return [(row.action, row.actor, row.subject) for row in rows]
