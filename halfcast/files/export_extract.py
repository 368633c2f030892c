"""Unpacking a downloaded export archive (``GET /jobs/{id}/exports/{kind}``) safely, and putting it in place.

The archive comes from a server and was built from files that training code wrote, so
nothing in it is trusted: every entry must be a regular file or a directory named
``<kind>/...`` with no absolute name, no ``..`` or empty component and no duplicate;
a link, a device, a FIFO or a sparse file refuses the whole archive before anything is
written (:class:`UnsafeArchive`). What passes is extracted with :mod:`tarfile`'s
``data`` filter (where this Python has it) into a fresh staging directory, then renamed
onto the destination in one step: the destination is either the whole export or as it
was before.
"""

from __future__ import annotations

import errno
import os
import tarfile
from pathlib import Path

from halfcast.files.export_files import MAX_FILES

#: Most entries (files and directories) an archive may hold.
MAX_MEMBERS = 2 * MAX_FILES


class UnsafeArchive(Exception):
    """The archive is not a well-formed export archive of plain files and directories."""


def _refusal(member: tarfile.TarInfo, kind: str) -> str | None:
    """Why ``member`` may not be extracted (``None``: it may)."""
    name = member.name
    parts = name.split("/")
    if not (member.isreg() or member.isdir()) or member.issparse():
        return f"{name!r} is not a regular file or directory"
    if name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        return f"{name!r} is absolute or has an empty, '.' or '..' component"
    if parts[0] != kind or (member.isreg() and len(parts) < 2):
        return f"{name!r} is not under {kind}/"
    return None


def check_members(members: list[tarfile.TarInfo], kind: str) -> None:
    """Raise :class:`UnsafeArchive` unless every member may be extracted."""
    if len(members) > MAX_MEMBERS:
        raise UnsafeArchive(f"more than {MAX_MEMBERS} entries")
    seen: set[str] = set()
    for member in members:
        reason = _refusal(member, kind)
        if reason is None and member.name in seen:
            reason = f"{member.name!r} appears twice"
        if reason is not None:
            raise UnsafeArchive(reason)
        seen.add(member.name)


def _extract(archive: tarfile.TarFile, members: list[tarfile.TarInfo], into: Path) -> None:
    if hasattr(tarfile, "data_filter"):
        archive.extractall(into, members=members, filter="data")
    else:  # an older Python: check_members already refused everything the filter would
        archive.extractall(into, members=members)


def extract_export(archive_path: Path, kind: str, into: Path) -> Path:
    """Extract the archive of export ``kind`` into the new directory ``into``; the path of ``<into>/<kind>``.

    Raises:
        UnsafeArchive: an entry is refused, or the file is not a tar archive.
    """
    into.mkdir()
    try:
        with tarfile.open(archive_path, mode="r:") as archive:
            members = archive.getmembers()
            check_members(members, kind)
            _extract(archive, members, into)
    except (tarfile.TarError, EOFError) as exc:  # FilterError is a TarError
        raise UnsafeArchive(f"not a valid export archive: {exc}") from exc
    tree = into / kind
    tree.mkdir(exist_ok=True)  # an export without files
    return tree


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and not any(path.iterdir())


def check_destination(dest: Path, *, overwrite: bool) -> None:
    """Raise ``FileExistsError`` if ``dest`` exists and is not an empty directory (unless ``overwrite``)."""
    if overwrite or not os.path.lexists(dest) or _is_empty_dir(dest):
        return
    raise FileExistsError(errno.EEXIST, "it exists and is not an empty directory", str(dest))


def place_tree(tree: Path, dest: Path, *, overwrite: bool, trash: Path) -> None:
    """Rename ``tree`` onto ``dest``; an existing ``dest`` is moved to ``trash`` first (``overwrite`` only).

    An empty directory at ``dest`` is simply replaced. Raises ``FileExistsError`` as
    :func:`check_destination`.
    """
    check_destination(dest, overwrite=overwrite)
    if os.path.lexists(dest) and not _is_empty_dir(dest):
        os.replace(dest, trash)
    os.replace(tree, dest)
