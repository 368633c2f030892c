"""Writing a streamed HTTP answer to a file so that the file is either whole or absent.

The body goes to ``<destination>.part``, is flushed and fsynced, its length is checked
against ``Content-Length``, and only then is it moved onto ``destination``
(``os.replace``). A download cut short leaves no file under ``destination``.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx

#: Bytes read per chunk.
CHUNK_BYTES = 1 << 20


class IncompleteDownload(Exception):
    """The answer ended before ``Content-Length`` bytes came."""


def save_response(response: httpx.Response, destination: Path) -> int:
    """Stream ``response``'s body into ``destination`` atomically; the number of bytes written.

    Raises:
        IncompleteDownload: fewer (or more) bytes than ``Content-Length`` arrived.
        OSError: the file could not be written (``<destination>.part`` is removed).
    """
    partial = destination.with_name(destination.name + ".part")
    expected = response.headers.get("content-length")
    written = 0
    try:
        with partial.open("wb") as handle:
            for chunk in response.iter_bytes(CHUNK_BYTES):
                handle.write(chunk)
                written += len(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        if expected is not None and written != int(expected):
            raise IncompleteDownload(f"{response.url}: got {written} of {expected} bytes")
        os.replace(partial, destination)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return written
