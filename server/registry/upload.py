"""A request body streamed into a file: hashed (SHA-256) and counted as it arrives, never held in memory whole.

The body is read with ``request.stream()`` in chunks and written through a worker thread in
batches of :data:`WRITE_BATCH` bytes. Past ``max_bytes`` the upload is refused with ``413``
at once, and past a storage-quota bound (``quota``: the bytes the owner has left) with the
quota's ``429``, before another chunk is read or written; a client that disconnects mid-way
raises Starlette's ``ClientDisconnect``. Either way the caller removes the file (the routes do,
in ``finally``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import anyio
from fastapi import Request
from starlette.concurrency import run_in_threadpool

from server.http.errors import ApiError
from server.registry.upload_gate import UploadPace

#: Bytes gathered before one write to the file.
WRITE_BATCH = 1 << 20


@dataclass(frozen=True)
class Received:
    """What arrived: ``bytes`` written to the file and their ``sha256`` (hex)."""

    bytes: int
    sha256: str


def too_large(max_bytes: int) -> ApiError:
    """The ``413`` of an upload over ``max_bytes`` (``HALFCAST_MAX_UPLOAD_BYTES``)."""
    return ApiError(413, f"the upload exceeds {max_bytes} bytes (HALFCAST_MAX_UPLOAD_BYTES)")


def declared_length(request: Request) -> int | None:
    """The request's ``Content-Length``, if it declares a valid one."""
    try:
        return int(request.headers["content-length"])
    except (KeyError, ValueError):
        return None


@dataclass(frozen=True)
class QuotaBound:
    """Stop an upload past ``max_bytes`` with ``refusal()`` (the owner's storage quota's ``429``)."""

    max_bytes: int
    refusal: Callable[[], Exception]


async def _paced(request: Request, pace: UploadPace | None) -> AsyncIterator[bytes]:
    """The body's chunks; ``408`` when one takes longer than ``pace.idle_s`` or the average rate falls too low."""
    chunks = request.stream().__aiter__()
    started, received = time.monotonic(), 0
    while True:
        try:
            if pace is None:
                chunk = await chunks.__anext__()
            else:
                with anyio.fail_after(pace.idle_s):
                    chunk = await chunks.__anext__()
        except StopAsyncIteration:
            return
        except TimeoutError:
            assert pace is not None  # only a paced read times out
            raise pace.stalled() from None
        received += len(chunk)
        if pace is not None:
            pace.check(received, time.monotonic() - started)
        yield chunk


async def receive_to_file(
    request: Request, path: Path, max_bytes: int, quota: QuotaBound | None = None, pace: UploadPace | None = None
) -> Received:
    """Stream the body of ``request`` into the new file ``path``; ``413`` past ``max_bytes``, ``quota``'s refusal past
    it, ``408`` for a body slower than ``pace`` allows."""
    digest = hashlib.sha256()
    size = 0
    pending: list[bytes] = []
    pending_size = 0
    handle: BinaryIO = await run_in_threadpool(path.open, "xb")
    try:
        async for chunk in _paced(request, pace):
            size += len(chunk)
            if size > max_bytes:
                raise too_large(max_bytes)
            if quota is not None and size > quota.max_bytes:
                raise quota.refusal()
            digest.update(chunk)
            pending.append(chunk)
            pending_size += len(chunk)
            if pending_size >= WRITE_BATCH:
                await run_in_threadpool(handle.write, b"".join(pending))
                pending, pending_size = [], 0
        if pending:
            await run_in_threadpool(handle.write, b"".join(pending))
    finally:
        await run_in_threadpool(handle.close)
    return Received(size, digest.hexdigest())
