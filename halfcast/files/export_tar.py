"""An export (:mod:`halfcast.files.export_files`) as an uncompressed POSIX tar, streamed without holding it in memory.

Entries are the export's regular files, named ``<kind>/<file>``, in name order: mode
``0644``, uid and gid 0, no owner names, the file's mtime (whole seconds); no directory
entries. Headers are ustar, with a pax extended header only where a name or size does
not fit. The archive ends with two zero blocks (no padding to a record), so its length
is known before a byte is read (:func:`archive_size`): a client checks it against
``Content-Length``.

Files are opened below the export's directory one component at a time, never following
a link, and must still be regular files of the listed size. A file that vanishes, is
replaced by something else, or changes size while it is sent raises
:class:`ExportChanged` (logged): the response is then cut short, never padded.
"""

from __future__ import annotations

import logging
import os
import stat
import tarfile
from collections.abc import Iterator

from halfcast.files.export_files import Export, ExportFile

log = logging.getLogger(__name__)

BLOCK = 512
#: The end of an archive: two zero blocks.
END_OF_ARCHIVE = bytes(2 * BLOCK)
#: Bytes read from a file at a time.
CHUNK_BYTES = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY


class ExportChanged(Exception):
    """A file of the export vanished, was replaced, or changed size since it was listed."""


def member_header(export: Export, file: ExportFile) -> bytes:
    """The header block(s) of ``file`` in the archive of ``export``."""
    info = tarfile.TarInfo(f"{export.kind.value}/{file.name}")
    info.size, info.mtime, info.mode, info.type = file.size_bytes, file.mtime, 0o644, tarfile.REGTYPE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")


def _padding(size: int) -> int:
    return -size % BLOCK


def archive_size(export: Export) -> int:
    """The exact length of the archive :func:`stream_archive` writes."""
    members = sum(len(member_header(export, f)) + f.size_bytes + _padding(f.size_bytes) for f in export.files)
    return members + len(END_OF_ARCHIVE)


def _open_beneath(root_fd: int, name: str) -> int:
    """A read descriptor of ``name`` below ``root_fd``, no component followed if it is a link."""
    *folders, leaf = name.split("/")
    fd = os.dup(root_fd)
    try:
        for folder in folders:
            inner = os.open(folder, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
        return os.open(leaf, _FILE_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)


def _file_chunks(root_fd: int, file: ExportFile) -> Iterator[bytes]:
    """The bytes of ``file``, exactly ``file.size_bytes`` of them, or :class:`ExportChanged`."""
    try:
        fd = _open_beneath(root_fd, file.name)
    except OSError as exc:
        raise ExportChanged(f"{file.name} cannot be opened any more: {exc.strerror}") from exc
    with os.fdopen(fd, "rb", buffering=0) as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size != file.size_bytes:
            raise ExportChanged(f"{file.name} is no longer a regular file of {file.size_bytes} bytes")
        left = file.size_bytes
        while left:
            chunk = handle.read(min(CHUNK_BYTES, left))
            if not chunk:
                raise ExportChanged(
                    f"{file.name} shrank: only {file.size_bytes - left} of its {file.size_bytes} bytes were there"
                )
            left -= len(chunk)
            yield chunk
        if handle.read(1):
            raise ExportChanged(f"{file.name} grew past {file.size_bytes} bytes")


def _members(export: Export) -> Iterator[bytes]:
    root_fd = os.open(export.path, _DIR_FLAGS)
    try:
        for file in export.files:
            yield member_header(export, file)
            yield from _file_chunks(root_fd, file)
            if pad := _padding(file.size_bytes):
                yield bytes(pad)
    finally:
        os.close(root_fd)


def stream_archive(export: Export) -> Iterator[bytes]:
    """The archive of ``export``, in chunks; :class:`ExportChanged` (logged) cuts it short."""
    try:
        yield from _members(export)
    except (ExportChanged, OSError) as exc:
        log.error("aborted the archive of %s (attempt %d) after a change: %s", export.path, export.attempt, exc)
        raise
    yield END_OF_ARCHIVE
