"""A job's exports in the runs directory, as the API lists and serves them (torch-free).

For a successful job the trainer writes ``<runs_dir>/<job_id>/attempt-<n>/export/adapter/``
(a PEFT adapter: ``adapter_config.json``, ``adapter_model.safetensors``) when the job
trained an adapter, and ``export/model/`` (a merged Hugging Face model directory). Each is
written to a temporary sibling and renamed into place, so only a directory named exactly
as an :class:`ExportKind` is complete; anything else under ``export/`` is never listed or
served.

An export is written by training code whose inputs a user controls, so it is walked
without following links: a symlink, or anything that is neither a regular file nor a
directory, anywhere in it refuses the whole export (logged; it is then neither listed nor
served), as do more than :data:`MAX_FILES` files, a path deeper than :data:`MAX_DEPTH`
directories, or a name that is not UTF-8. A served export is a tar of its files
(:mod:`halfcast.files.export_tar`).
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from halfcast.contracts.rundir import ExportKind, JobRuns

__all__ = [
    "MAX_DEPTH",
    "MAX_FILES",
    "Export",
    "ExportFile",
    "ExportKind",
    "UnsafeExport",
    "find_export",
    "list_exports",
    "read_export",
]

log = logging.getLogger(__name__)

#: Most files one export may hold.
MAX_FILES = 10_000
#: Most directories a file of an export may be nested in, below the export's own.
MAX_DEPTH = 8


class UnsafeExport(Exception):
    """The export holds a link or a special file, or exceeds :data:`MAX_FILES` / :data:`MAX_DEPTH`."""


@dataclass(frozen=True)
class ExportFile:
    """One regular file of an export: ``name`` relative to the export's directory (``/``-separated)."""

    name: str
    size_bytes: int
    mtime: int
    path: Path


@dataclass(frozen=True)
class Export:
    """One complete export of one attempt: its files sorted by name, their total size, the newest change (UTC)."""

    kind: ExportKind
    attempt: int
    files: tuple[ExportFile, ...]
    modified_at: datetime
    path: Path

    @property
    def size_bytes(self) -> int:
        """Bytes of every file together."""
        return sum(f.size_bytes for f in self.files)


def _is_real_dir(path: Path) -> bool:
    """``path`` is a directory itself, not a link to one."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def _checked_name(root: Path, path: str) -> str:
    relative = Path(path).relative_to(root).as_posix()
    try:
        relative.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafeExport(f"{relative!r} is not a UTF-8 name") from None
    return relative


def _walk(root: Path, folder: Path, depth: int, found: list[ExportFile]) -> None:
    """Append the regular files under ``folder`` to ``found``, refusing links, special files and excess."""
    with os.scandir(folder) as entries:
        for entry in entries:
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                if depth >= MAX_DEPTH:
                    raise UnsafeExport(
                        f"{_checked_name(root, entry.path)} is nested more than {MAX_DEPTH} directories deep"
                    )
                _walk(root, Path(entry.path), depth + 1, found)
            elif stat.S_ISREG(info.st_mode):
                if len(found) >= MAX_FILES:
                    raise UnsafeExport(f"more than {MAX_FILES} files")
                found.append(
                    ExportFile(_checked_name(root, entry.path), info.st_size, int(info.st_mtime), Path(entry.path))
                )
            else:
                raise UnsafeExport(f"{_checked_name(root, entry.path)} is not a regular file or directory")


def read_export(path: Path, kind: ExportKind, attempt: int) -> Export | None:
    """The export at ``path`` (``None``: not there, or refused as :class:`UnsafeExport`, which is logged)."""
    if not _is_real_dir(path):
        return None
    found: list[ExportFile] = []
    try:
        _walk(path, path, 0, found)
        newest = max([path.lstat().st_mtime, *(f.mtime for f in found)])
    except UnsafeExport as exc:
        log.warning("refusing export %s: %s", path, exc)
        return None
    except FileNotFoundError:  # removed while being read (a job's runs directory deleted)
        return None
    files = tuple(sorted(found, key=lambda f: f.name))
    return Export(kind, attempt, files, datetime.fromtimestamp(newest, UTC), path)


def _in_attempt(runs_dir: Path, job_id: str, attempt: int, kind: ExportKind) -> Export | None:
    run = JobRuns.of(runs_dir, job_id).attempt(attempt)
    if not (_is_real_dir(run.path) and _is_real_dir(run.export)):
        return None
    return read_export(run.export_of(kind), kind, attempt)


def find_export(runs_dir: Path, job_id: str, kind: ExportKind, attempt: int | None = None) -> Export | None:
    """The export ``kind`` of ``attempt`` (default: the newest attempt that has one), or ``None``."""
    attempts = [attempt] if attempt is not None else list(reversed(JobRuns.of(runs_dir, job_id).attempt_numbers()))
    for number in attempts:
        found = _in_attempt(runs_dir, job_id, number, kind)
        if found is not None:
            return found
    return None


def list_exports(runs_dir: Path, job_id: str) -> list[Export]:
    """Each kind's export from the newest attempt that has it (a retried job's: the attempt that succeeded)."""
    return [found for kind in ExportKind if (found := find_export(runs_dir, job_id, kind)) is not None]
