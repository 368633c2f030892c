"""``/datasets``: upload a JSON-lines or CSV dataset file, list, read and delete registered datasets.

``POST /datasets?format=...&name=...`` takes the file itself as the request body
(``Content-Type: application/jsonl`` or ``text/csv``), streamed to a staging file while it
is hashed (never held in memory whole; at most ``HALFCAST_MAX_UPLOAD_BYTES``, else 413).
Every row is checked against ``format`` by the trainer's own parser (:mod:`server.registry.dataset_check`):
the first bad one is a 422 naming its line and field, and nothing is stored. An accepted file
is stored under its SHA-256 (:mod:`halfcast.core.db.registry`). A job names it with
``dataset: {"name": "jsonl", "config": {"dataset_id": ...}}``. Owner isolation is that of jobs
(another owner's dataset is a 404; admins see all); uploads and deletions are audited; the
owner's storage quota is checked (429).
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path as FilePath
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from halfcast.contracts.catalog import JsonlFormat
from halfcast.core.db import registry as repo
from halfcast.core.db.models import RegisteredDataset, utcnow
from halfcast.core.db.quota_check import QuotaExceeded
from halfcast.core.db.registry import UploadKey, UploadKeyMismatch
from halfcast.core.registry.layout import RegistryLayout, remove_path
from halfcast.core.settings import Settings
from server.access import visible_dataset_or_404
from server.auth import PrincipalDep, authenticate
from server.deps import SessionDep, SettingsDep
from server.http.idempotency import IdempotencyKey, key_mismatch
from server.quotas import QUOTA_RESPONSE, QuotaApiError, default_limits
from server.registry.dataset_check import DatasetRejected, check_dataset_file
from server.registry.idempotent_upload import earlier_upload, replay, upload_key
from server.registry.request_checks import (
    REGISTRY_ID_PATTERN,
    checked_name,
    invalid,
    media_type,
    storage_room,
    unsupported_media_type,
)
from server.registry.rows import delete_visible, visible_page
from server.registry.schemas import DatasetList, DatasetPublic, dataset_public
from server.registry.upload import QuotaBound, Received, receive_to_file
from server.registry.upload_gate import upload_pace
from server.schemas import ErrorBody

log = logging.getLogger(__name__)

#: The path of uploads (the body-size middleware streams it instead of buffering it).
UPLOAD_PATH = "/datasets"

router = APIRouter(prefix=UPLOAD_PATH, tags=["datasets"], dependencies=[Depends(authenticate)])

#: Content types of a dataset file, and the file format each means.
CONTENT_TYPES = {
    "application/jsonl": "jsonl",
    "application/x-ndjson": "jsonl",
    "application/x-jsonlines": "jsonl",
    "application/jsonlines": "jsonl",
    "text/csv": "csv",
}
_BODY = {
    "requestBody": {
        "required": True,
        "description": "The dataset file: JSON lines or CSV with a header row",
        "content": {kind: {"schema": {"type": "string"}} for kind in ("application/jsonl", "text/csv")},
    }
}
_NOT_FOUND: dict[int | str, dict[str, object]] = {404: {"model": ErrorBody, "description": "Unknown dataset"}}
DatasetId = Annotated[str, Path(max_length=64, pattern=REGISTRY_ID_PATTERN)]


@router.post(
    "",
    status_code=201,
    response_model=DatasetPublic,
    openapi_extra=_BODY,
    responses={
        413: {"model": ErrorBody, "description": "The file exceeds HALFCAST_MAX_UPLOAD_BYTES"},
        415: {"model": ErrorBody, "description": "Content-Type is neither JSON lines nor CSV"},
        429: QUOTA_RESPONSE,
    },
)
async def upload_dataset(
    request: Request,
    response: Response,
    principal: PrincipalDep,
    settings: SettingsDep,
    format: Annotated[JsonlFormat, Query(description="The format every row is checked against")],
    name: Annotated[str | None, Query(min_length=1, max_length=200, description="default: dataset")] = None,
    idempotency_key: IdempotencyKey = None,
) -> DatasetPublic:
    """Check every row of the uploaded file against ``format`` and register it; ``Location`` names the dataset.

    With an ``Idempotency-Key`` the owner used before for the same upload: ``200`` and that dataset,
    nothing stored (:mod:`server.registry.idempotent_upload`).
    """
    async with request.app.state.upload_gate.admit(principal.owner):  # before a byte is read
        file_format = _file_format(request, format)
        label = checked_name(name, "dataset")
        earlier = await earlier_upload(request, RegisteredDataset, principal.owner, idempotency_key)
        room = None
        if earlier is None:
            room = await storage_room(request, principal.owner, default_limits(settings), declared_is_stored=True)
        staged = await run_in_threadpool(RegistryLayout(settings.registry_dir).staging_path, f".{file_format}")
        try:
            bound = None if room is None else QuotaBound(room.left, room.exceeded)
            received = await receive_to_file(request, staged, settings.max_upload_bytes, bound, upload_pace(settings))
            upload = upload_key(idempotency_key, "dataset", format, file_format, label, received.sha256)
            if earlier is not None:
                return dataset_public(replay(earlier, upload, "dataset", response, f"{UPLOAD_PATH}/{earlier.id}"))
            rows = await run_in_threadpool(_checked_rows, staged, label, file_format, format)
            row = _row(principal.owner, label, format, file_format, rows, received)
            stored, created = await run_in_threadpool(_store, request, row, staged, settings, upload)
        finally:
            await run_in_threadpool(remove_path, staged)
    _answer(response, stored, created)
    return stored


def _file_format(request: Request, fmt: str) -> str:
    """The upload's file format (``jsonl`` or ``csv``) by its media type; ``415``, or ``422`` for chat in CSV."""
    kind = media_type(request)
    file_format = CONTENT_TYPES.get(kind)
    if file_format is None:
        raise unsupported_media_type(kind, sorted(CONTENT_TYPES))
    if fmt == "chat" and file_format == "csv":
        raise invalid(("query", "format"), "format 'chat' reads JSON lines, not CSV", fmt)
    return file_format


def _row(owner: str, name: str, fmt: str, file_format: str, rows: int, received: Received) -> RegisteredDataset:
    return RegisteredDataset(
        id=str(uuid.uuid4()),
        owner=owner,
        name=name,
        format=fmt,
        file_format=file_format,
        rows=rows,
        bytes=received.bytes,
        sha256=received.sha256,
        created_at=utcnow(),
    )


def _answer(response: Response, stored: DatasetPublic, created: bool) -> None:
    """``201`` for a new dataset (logged), ``200`` for its Idempotency-Key's earlier one; ``Location`` either way."""
    if created:
        log.info("dataset %s registered for %s: %d rows, %d bytes", stored.id, stored.owner, stored.rows, stored.bytes)
    else:
        response.status_code = 200
    response.headers["Location"] = f"{UPLOAD_PATH}/{stored.id}"


def _checked_rows(staged: FilePath, name: str, file_format: str, fmt: str) -> int:
    try:
        return check_dataset_file(staged, name, file_format, fmt)
    except DatasetRejected as exc:
        loc: tuple[str | int, ...] = ("body",)
        if exc.line is not None:
            loc = ("body", "line", exc.line) + ((exc.field,) if exc.field is not None else ())
        raise invalid(loc, exc.message) from None


def _store(
    request: Request, row: RegisteredDataset, staged: FilePath, settings: Settings, upload: UploadKey | None
) -> tuple[DatasetPublic, bool]:
    """The stored dataset and whether this upload created it (``False``: its Idempotency-Key's earlier one)."""
    with request.app.state.session_factory() as session:
        try:
            stored, created = repo.create_dataset(
                session, row, staged, RegistryLayout(settings.registry_dir), default_limits(settings), upload
            )
        except QuotaExceeded as exc:
            raise QuotaApiError(exc) from None
        except UploadKeyMismatch as exc:
            raise key_mismatch(str(exc), upload.key if upload else None) from None
        return dataset_public(stored), created


@router.get("", response_model=DatasetList)
def list_datasets(
    session: SessionDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=512, description="next_cursor of the previous page")] = None,
) -> DatasetList:
    """The caller's datasets (an admin's: everyone's), newest first."""
    page = visible_page(session, RegisteredDataset, principal, limit, cursor)
    return DatasetList(datasets=[dataset_public(row) for row in page.rows], next_cursor=page.next_cursor)


@router.get("/{dataset_id}", response_model=DatasetPublic, responses=_NOT_FOUND)
def get_dataset(dataset_id: DatasetId, session: SessionDep, principal: PrincipalDep) -> DatasetPublic:
    """One registered dataset."""
    return dataset_public(visible_dataset_or_404(repo.get_dataset(session, dataset_id), dataset_id, principal))


@router.delete(
    "/{dataset_id}",
    status_code=204,
    response_class=Response,
    responses={**_NOT_FOUND, 409: {"model": ErrorBody, "description": "A job that has not ended uses it"}},
)
def delete_dataset(
    dataset_id: DatasetId, session: SessionDep, settings: SettingsDep, principal: PrincipalDep
) -> Response:
    """Delete the dataset (its file too, unless another registered dataset has the same bytes)."""
    delete_visible(session, repo.RegisteredKind.DATASET, dataset_id, settings, principal)
    return Response(status_code=204)
