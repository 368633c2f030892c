"""Where text bytes come from: the interpreter's standard library, or a file under a data root.

Data roots are the directories named in ``HALFCAST_DATA_ROOTS`` (separated by
``os.pathsep``); a ``file`` source may only read a regular file inside one of them.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from halfcast.contracts.status import FailureReason
from trainer.errors import TrainerError
from trainer.roots import DATA_ROOTS

DATA_ROOTS_ENV = DATA_ROOTS.env

#: Third-party code is installed inside the stdlib tree on some layouts; it is not stdlib text.
_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


def stdlib_python_files(root: Path | None = None) -> Iterator[Path]:
    """The ``.py`` files under ``root`` (default: ``sysconfig.get_paths()["stdlib"]``).

    Deterministic order: a depth-first walk with directory and file names sorted;
    ``site-packages``, ``dist-packages`` and ``__pycache__`` are skipped.
    """
    top = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    for directory, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS)
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield Path(directory) / name


def read_stdlib(max_bytes: int, root: Path | None = None) -> bytes:
    """The first ``max_bytes`` bytes of the concatenated :func:`stdlib_python_files`.

    Raises :class:`TrainerError` (``data_unavailable``) when no source text is found.
    """
    parts: list[bytes] = []
    size = 0
    for path in stdlib_python_files(root):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        parts.append(data[: max_bytes - size])
        size += len(parts[-1])
        if size >= max_bytes:
            break
    if size == 0:
        raise TrainerError(FailureReason.DATA_UNAVAILABLE, "no Python standard library sources found on this worker")
    return b"".join(parts)


def data_roots() -> list[Path]:
    """The configured data roots, from ``HALFCAST_DATA_ROOTS`` (empty entries ignored)."""
    return DATA_ROOTS.roots()


def resolve_data_file(relative: str, roots: list[Path] | None = None) -> Path:
    """The real path of ``relative`` inside the first data root that holds it as a regular file.

    Raises :class:`TrainerError` (``data_unavailable``) for an absolute path, a path with
    a ``..`` component, a path whose real location (after following symlinks) leaves
    its root, no configured roots, or no root holding the file (:mod:`trainer.roots`).
    """
    return DATA_ROOTS.resolve(relative, roots, kind="file")


def read_data_file(relative: str, max_bytes: int, roots: list[Path] | None = None) -> bytes:
    """The first ``max_bytes`` bytes of :func:`resolve_data_file`; ``data_unavailable`` if unreadable or empty."""
    path = resolve_data_file(relative, roots)
    try:
        with path.open("rb") as handle:
            data = handle.read(max_bytes)
    except OSError as exc:
        raise TrainerError(FailureReason.DATA_UNAVAILABLE, f"cannot read dataset file {relative!r}: {exc}") from exc
    if not data:
        raise TrainerError(FailureReason.DATA_UNAVAILABLE, f"dataset file {relative!r} is empty")
    return data


def open_data_file(relative: str, max_bytes: int, roots: list[Path] | None = None) -> BinaryIO:
    """:func:`resolve_data_file` opened for streaming reads (binary); the caller closes it.

    Raises :class:`TrainerError` (``data_unavailable``) when the file cannot be opened,
    is empty, or is larger than ``max_bytes`` (never read in part: a cut file would
    silently lose rows).
    """
    return open_bounded(resolve_data_file(relative, roots), relative, max_bytes)


def open_bounded(path: Path, name: str, max_bytes: int) -> BinaryIO:
    """``path`` opened for streaming binary reads; ``data_unavailable`` (naming the file ``name``) when it
    cannot be opened, is empty, or is larger than ``max_bytes``. The caller closes it."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise TrainerError(FailureReason.DATA_UNAVAILABLE, f"cannot read dataset file {name!r}: {exc}") from exc
    size = os.fstat(handle.fileno()).st_size
    if size == 0 or size > max_bytes:
        handle.close()
        problem = "is empty" if size == 0 else f"is {size} bytes, over max_bytes ({max_bytes})"
        raise TrainerError(FailureReason.DATA_UNAVAILABLE, f"dataset file {name!r} {problem}")
    return handle
