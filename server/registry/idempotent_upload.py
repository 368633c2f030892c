"""``Idempotency-Key`` on ``POST /datasets`` and ``POST /models``: a retried upload answers what the first one stored.

A client that disconnects after sending the whole body has its upload stored without ever seeing
the id; its retry with the same key gets that dataset or model (``200``) and nothing is stored
twice. What the request sent is hashed (its parameters and the body's SHA-256): the same key with
another upload is a ``422`` at ``["header", "Idempotency-Key"]``. The body of a replay is still
read (bounded by ``HALFCAST_MAX_UPLOAD_BYTES``, not by the storage quota, since it stores nothing)
so that its hash can be compared; it is neither checked nor extracted again. Two concurrent first
uploads with one key are settled under the owner's lock (:func:`halfcast.core.db.registry.create_dataset`).
"""

from __future__ import annotations

import hashlib

from fastapi import Request, Response
from starlette.concurrency import run_in_threadpool

from halfcast.core.db import registry as repo
from halfcast.core.db.registry import Row, UploadKey, UploadKeyMismatch
from server.http.idempotency import key_mismatch


def upload_key(key: str | None, *sent: str) -> UploadKey | None:
    """The :class:`UploadKey` of an upload with Idempotency-Key ``key`` that sent ``sent`` (``None`` without a key)."""
    if key is None:
        return None
    return UploadKey(key, hashlib.sha256("\0".join(sent).encode("utf-8", "surrogatepass")).hexdigest())


def _lookup(request: Request, table: type[Row], owner: str, key: str) -> Row | None:
    with request.app.state.session_factory() as session:
        row = repo.upload_by_key(session, table, owner, key)
        if row is not None:
            session.expunge(row)
        return row


async def earlier_upload(request: Request, table: type[Row], owner: str, key: str | None) -> Row | None:
    """What ``owner`` already uploaded with Idempotency-Key ``key`` (``None``: nothing, or no key)."""
    return None if key is None else await run_in_threadpool(_lookup, request, table, owner, key)


def replay(row: Row, upload: UploadKey | None, kind: str, response: Response, location: str) -> Row:
    """Answer a retried upload with ``row`` (``200``, ``Location``); ``422`` at the header if it sent something else."""
    assert upload is not None  # a row found by key means the request has a key
    try:
        repo.replayed(row, upload, kind)
    except UploadKeyMismatch as exc:
        raise key_mismatch(str(exc), upload.key) from None
    answer_existing(response, location)
    return row


def answer_existing(response: Response, location: str) -> None:
    """A ``200`` naming what an earlier upload with the same key created."""
    response.status_code = 200
    response.headers["Location"] = location
