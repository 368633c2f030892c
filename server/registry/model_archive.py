"""An uploaded model archive (an uncompressed tar) checked entry by entry, then extracted safely.

Every entry must be a regular file or a directory with a relative, printable name: an absolute
name, a ``..``, ``.`` or empty component (a leading ``./`` and a trailing ``/`` aside), a
backslash, a link (symbolic or hard), a device, a FIFO or a sparse file refuses the whole archive
("tar slip"), as do a duplicate name, a file that another entry puts a directory under (``foo``
and ``foo/bar``), more than :data:`MAX_MEMBERS` entries, a name longer than :data:`MAX_NAME_CHARS`
or with a part over :data:`MAX_PART_BYTES` bytes (a file system's limit), or nested more than
:data:`MAX_DEPTH` directories, and pickle weights
(:data:`PICKLE_SUFFIXES`: ``torch.load`` would run code from them). The model's files are at the
top of the archive or all under one top directory (as in ``halfcast export``'s and
``GET /jobs/{id}/exports/model``'s ``model/...`` tars), which is dropped. What passes is
extracted with :mod:`tarfile`'s ``data`` filter as well, into a new directory.
"""

from __future__ import annotations

import tarfile
from pathlib import Path, PurePosixPath

from trainer.hf.safety import CONFIG_FILE
from trainer.hf.safety import PICKLE_SUFFIXES as TRAINER_PICKLE_SUFFIXES

#: Most entries an archive may hold.
MAX_MEMBERS = 10_000
#: Most directories an entry may be nested in.
MAX_DEPTH = 8
#: Longest entry name.
MAX_NAME_CHARS = 1024
#: Longest part of an entry name, in UTF-8 bytes (``NAME_MAX`` of Linux file systems).
MAX_PART_BYTES = 255
#: File suffixes refused anywhere in the archive: pickled data.
PICKLE_SUFFIXES = TRAINER_PICKLE_SUFFIXES | {".pickle", ".joblib"}


class ArchiveRejected(Exception):
    """The archive is refused; ``entry`` names the entry at fault (``None``: the archive as a whole)."""

    def __init__(self, message: str, entry: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.entry = entry


class ArchiveOverQuota(Exception):
    """The archive's files hold ``file_bytes``, more than the owner may still store: nothing was extracted."""

    def __init__(self, file_bytes: int) -> None:
        super().__init__(f"the archive's files hold {file_bytes} bytes")
        self.file_bytes = file_bytes


#: Bytes of an archive that are not file contents: a header and padding per entry (a long name's PAX record
#: included), and the end-of-archive blocks. An upload is stopped once it is this far past the quota.
TAR_OVERHEAD_BYTES = 2048 * MAX_MEMBERS + 10240


def _normal_name(member: tarfile.TarInfo) -> str:
    """The entry's name without a leading ``./`` or trailing ``/``; :class:`ArchiveRejected` for an unsafe one."""
    raw = member.name
    if not raw.isprintable() or "\\" in raw or len(raw) > MAX_NAME_CHARS:
        raise ArchiveRejected(
            f"entry {raw!r}: the name must be printable, without backslashes, at most {MAX_NAME_CHARS} characters", raw
        )
    if raw.startswith("/"):
        raise ArchiveRejected(f"entry {raw!r}: absolute names are refused", raw)
    name = raw
    while name.startswith("./"):
        name = name[2:]
    name = name.rstrip("/") if member.isdir() else name
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ArchiveRejected(f"entry {raw!r}: '..', '.' and empty path components are refused", raw)
    if len(parts) > MAX_DEPTH + 1:
        raise ArchiveRejected(f"entry {raw!r}: nested deeper than {MAX_DEPTH} directories", raw)
    if any(len(part.encode("utf-8", "surrogateescape")) > MAX_PART_BYTES for part in parts):
        raise ArchiveRejected(f"entry {raw!r}: a name part is over {MAX_PART_BYTES} bytes", raw)
    return name


def _check_kind(member: tarfile.TarInfo, name: str) -> None:
    if member.issym() or member.islnk():
        raise ArchiveRejected(f"entry {name!r}: links are refused", name)
    if not (member.isreg() or member.isdir()) or member.issparse():
        raise ArchiveRejected(
            f"entry {name!r}: only regular files and directories are accepted (no devices, FIFOs)", name
        )
    if member.isreg() and PurePosixPath(name).suffix.lower() in PICKLE_SUFFIXES:
        raise ArchiveRejected(f"entry {name!r}: pickle files are refused (use *.safetensors weights)", name)


def checked_members(archive: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    """Every entry of ``archive`` by its normal name, each checked; :class:`ArchiveRejected` for the first refused."""
    found: dict[str, tarfile.TarInfo] = {}
    for member in archive:
        if len(found) >= MAX_MEMBERS:
            raise ArchiveRejected(f"the archive holds more than {MAX_MEMBERS} entries")
        name = _normal_name(member)
        _check_kind(member, name)
        if name in found:
            raise ArchiveRejected(f"entry {name!r} appears twice", name)
        found[name] = member
    _refuse_files_under_files(found)
    return found


def _refuse_files_under_files(found: dict[str, tarfile.TarInfo]) -> None:
    """:class:`ArchiveRejected` when an entry lies under a name another entry holds as a regular file."""
    files = {name for name, member in found.items() if member.isreg()}
    for name in found:
        parts = name.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in files:
                raise ArchiveRejected(f"entry {name!r} lies under {parent!r}, which is a file", name)


def model_root(names: list[str]) -> str:
    """The directory of the archive holding the model's ``config.json``: ``""`` (the top) or its one top directory."""
    if CONFIG_FILE in names:
        return ""
    tops = {name.split("/", 1)[0] for name in names}
    if len(tops) == 1 and f"{next(iter(tops))}/{CONFIG_FILE}" in names:
        return next(iter(tops))
    raise ArchiveRejected(f"no {CONFIG_FILE} at the top of the archive (or in its one top directory)", CONFIG_FILE)


def extract_model_archive(path: Path, into: Path, max_file_bytes: int | None = None) -> None:
    """Check the tar at ``path`` and extract the model's files into the new directory ``into``.

    Raises :class:`ArchiveRejected` for an archive refused as a whole or by an entry, or a file
    that is not an uncompressed tar; :class:`ArchiveOverQuota` (before anything is extracted)
    when its files hold more than ``max_file_bytes``.
    """
    try:
        with tarfile.open(path, mode="r:") as archive:
            members = checked_members(archive)
            root = model_root(list(members))
            into.mkdir()
            chosen = []
            for name, member in members.items():
                if root and name == root:
                    continue
                relative = name[len(root) + 1 :] if root else name
                chosen.append(member.replace(name=relative, deep=False))
            file_bytes = sum(member.size for member in chosen if member.isreg())
            if max_file_bytes is not None and file_bytes > max_file_bytes:
                raise ArchiveOverQuota(file_bytes)
            archive.extractall(into, members=chosen, filter="data")
    except (tarfile.TarError, EOFError) as exc:  # FilterError is a TarError
        raise ArchiveRejected(f"not an uncompressed tar archive, or a damaged one: {exc}") from None
