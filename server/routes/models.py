"""``/models``: upload a Hugging Face model directory as a tar, list, read and delete registered models; and
``POST /jobs/{id}/exports/model/register``: a job's exported model registered in one call.

``POST /models?name=...`` takes an uncompressed tar (``Content-Type: application/x-tar``) of the model
directory (``config.json``, ``*.safetensors``, tokenizer files), streamed to a staging file (at most
``HALFCAST_MAX_UPLOAD_BYTES``, else 413), checked entry by entry (no absolute names, ``..``, links,
devices, pickle files: :mod:`server.registry.model_archive`), extracted with tarfile's ``data`` filter,
and checked as a model (:mod:`server.registry.model_check`: a supported ``model_type``, no remote code,
safetensors weights). A refusal is a 422 naming the entry, and nothing is stored. A job names a
registered model with ``model: {"name": "hf", "config": {"model_id": ...}}``; so a fine-tuned model can
be fine-tuned again, registering an export copies the job's ``export/model`` into the registry as a
model of the job's owner. Isolation, audit and the storage quota are as for datasets.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path as FilePath
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from halfcast.core.db import registry as repo
from halfcast.core.db.models import RegisteredModel, utcnow
from halfcast.core.db.quota_check import QuotaExceeded
from halfcast.core.db.registry import UploadKey, UploadKeyMismatch
from halfcast.core.registry.layout import RegistryLayout, remove_path
from halfcast.core.settings import Settings
from halfcast.files.export_files import ExportKind, find_export
from server.access import visible_job_or_404, visible_model_or_404
from server.auth import PrincipalDep, authenticate
from server.deps import SessionDep, SettingsDep
from server.http.errors import ApiError
from server.http.idempotency import IdempotencyKey, key_mismatch
from server.quotas import QUOTA_RESPONSE, QuotaApiError, default_limits
from server.registry.export_copy import copy_export
from server.registry.idempotent_upload import earlier_upload, replay, upload_key
from server.registry.model_archive import (
    TAR_OVERHEAD_BYTES,
    ArchiveOverQuota,
    ArchiveRejected,
    extract_model_archive,
)
from server.registry.model_check import ModelSummary, summarise_model_dir
from server.registry.request_checks import (
    REGISTRY_ID_PATTERN,
    StorageRoom,
    checked_name,
    invalid,
    media_type,
    storage_room,
    unsupported_media_type,
)
from server.registry.rows import delete_visible, visible_page
from server.registry.schemas import ModelList, ModelPublic, model_public
from server.registry.upload import QuotaBound, receive_to_file
from server.registry.upload_gate import upload_pace
from server.schemas import ErrorBody

log = logging.getLogger(__name__)

#: The path of uploads (the body-size middleware streams it instead of buffering it).
UPLOAD_PATH = "/models"
#: Content types of a model archive.
CONTENT_TYPES = ("application/x-tar", "application/tar")

router = APIRouter(tags=["models"], dependencies=[Depends(authenticate)])

_BODY = {
    "requestBody": {
        "required": True,
        "description": "An uncompressed tar of the model directory",
        "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}},
    }
}
_NOT_FOUND: dict[int | str, dict[str, object]] = {404: {"model": ErrorBody, "description": "Unknown model"}}
_CREATED: dict[int | str, dict[str, object]] = {429: QUOTA_RESPONSE}
ModelId = Annotated[str, Path(max_length=64, pattern=REGISTRY_ID_PATTERN)]
ModelName = Annotated[str | None, Query(min_length=1, max_length=200, description="default: model")]


@router.post(
    UPLOAD_PATH,
    status_code=201,
    response_model=ModelPublic,
    openapi_extra=_BODY,
    responses={
        **_CREATED,
        413: {"model": ErrorBody, "description": "The archive exceeds HALFCAST_MAX_UPLOAD_BYTES"},
        415: {"model": ErrorBody, "description": "Content-Type is not application/x-tar"},
    },
)
async def upload_model(
    request: Request,
    response: Response,
    principal: PrincipalDep,
    settings: SettingsDep,
    name: ModelName = None,
    idempotency_key: IdempotencyKey = None,
) -> ModelPublic:
    """Check the uploaded model archive and register the model; ``Location`` names it.

    With an ``Idempotency-Key`` the owner used before for the same upload: ``200`` and that model,
    nothing stored (:mod:`server.registry.idempotent_upload`).
    """
    async with request.app.state.upload_gate.admit(principal.owner):  # before a byte is read
        kind = media_type(request)
        if kind not in CONTENT_TYPES:
            raise unsupported_media_type(kind, list(CONTENT_TYPES))
        label = checked_name(name, "model")
        earlier = await earlier_upload(request, RegisteredModel, principal.owner, idempotency_key)
        room = None
        if earlier is None:  # the archive is larger than its files: its declared length is not held to the quota
            room = await storage_room(request, principal.owner, default_limits(settings), declared_is_stored=False)
        layout = RegistryLayout(settings.registry_dir)
        archive = await run_in_threadpool(layout.staging_path, ".tar")
        tree = archive.with_suffix(".d")
        try:
            bound = None if room is None else QuotaBound(room.left + TAR_OVERHEAD_BYTES, room.exceeded)
            received = await receive_to_file(request, archive, settings.max_upload_bytes, bound, upload_pace(settings))
            upload = upload_key(idempotency_key, "model", label, received.sha256)
            if earlier is not None:
                return model_public(replay(earlier, upload, "model", response, f"{UPLOAD_PATH}/{earlier.id}"))
            summary = await run_in_threadpool(_extracted, archive, tree, room)
            await run_in_threadpool(remove_path, archive)
            row = _row(principal.owner, label, summary, None)
            stored, created = await run_in_threadpool(_store, request, row, tree, settings, "upload", upload)
        finally:
            await run_in_threadpool(remove_path, archive)
            await run_in_threadpool(remove_path, tree)
        if not created:
            response.status_code = 200
        response.headers["Location"] = f"{UPLOAD_PATH}/{stored.id}"
        return stored


def _extracted(archive: FilePath, tree: FilePath, room: StorageRoom | None) -> ModelSummary:
    """The archive extracted into ``tree`` and summarised; never more extracted than ``room`` has left (``429``)."""
    try:
        extract_model_archive(archive, tree, None if room is None else room.left)
        return summarise_model_dir(tree)
    except ArchiveOverQuota:
        assert room is not None  # only raised with a bound
        raise room.exceeded() from None
    except ArchiveRejected as exc:
        loc: tuple[str | int, ...] = ("body",) if exc.entry is None else ("body", exc.entry)
        raise invalid(loc, exc.message) from None


def _row(owner: str, name: str, summary: ModelSummary, job_id: str | None) -> RegisteredModel:
    return RegisteredModel(
        id=str(uuid.uuid4()),
        owner=owner,
        name=name,
        model_type=summary.model_type,
        files=summary.files,
        bytes=summary.bytes,
        sha256=summary.sha256,
        source_job_id=job_id,
        created_at=utcnow(),
    )


def _store(
    request: Request,
    row: RegisteredModel,
    tree: FilePath,
    settings: Settings,
    via: str,
    upload: UploadKey | None,
    actor: str | None = None,
) -> tuple[ModelPublic, bool]:
    """The stored model and whether this request created it (``False``: its Idempotency-Key's earlier upload)."""
    layout = RegistryLayout(settings.registry_dir)
    with request.app.state.session_factory() as session:
        try:
            stored, created = repo.create_model(
                session, row, tree, layout, default_limits(settings), actor=actor or row.owner, via=via, upload=upload
            )
        except QuotaExceeded as exc:
            raise QuotaApiError(exc) from None
        except UploadKeyMismatch as exc:
            raise key_mismatch(str(exc), upload.key if upload else None) from None
        if not created:
            return model_public(stored), False
        log.info(
            "model %s (%s) registered for %s via %s: %d files, %d bytes",
            stored.id,
            stored.model_type,
            stored.owner,
            via,
            stored.files,
            stored.bytes,
        )
        return model_public(stored), True


@router.get(UPLOAD_PATH, response_model=ModelList)
def list_models(
    session: SessionDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=512, description="next_cursor of the previous page")] = None,
) -> ModelList:
    """The caller's models (an admin's: everyone's), newest first."""
    page = visible_page(session, RegisteredModel, principal, limit, cursor)
    return ModelList(models=[model_public(row) for row in page.rows], next_cursor=page.next_cursor)


@router.get(UPLOAD_PATH + "/{model_id}", response_model=ModelPublic, responses=_NOT_FOUND)
def get_model(model_id: ModelId, session: SessionDep, principal: PrincipalDep) -> ModelPublic:
    """One registered model."""
    return model_public(visible_model_or_404(repo.get_model(session, model_id), model_id, principal))


@router.delete(
    UPLOAD_PATH + "/{model_id}",
    status_code=204,
    response_class=Response,
    responses={**_NOT_FOUND, 409: {"model": ErrorBody, "description": "A job that has not ended uses it"}},
)
def delete_model(model_id: ModelId, session: SessionDep, settings: SettingsDep, principal: PrincipalDep) -> Response:
    """Delete the model and its files."""
    delete_visible(session, repo.RegisteredKind.MODEL, model_id, settings, principal)
    return Response(status_code=204)


@router.post(
    "/jobs/{job_id}/exports/model/register",
    status_code=201,
    response_model=ModelPublic,
    responses={
        **_CREATED,
        404: {"model": ErrorBody, "description": "Unknown job, or it has no model export"},
        409: {"model": ErrorBody, "description": "The exported model is not one the registry accepts"},
    },
)
def register_export(
    job_id: Annotated[str, Path(max_length=64)],
    request: Request,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    name: ModelName = None,
) -> ModelPublic:
    """Register the job's exported model (``export/model``, newest attempt) as a model of the job's owner."""
    job = visible_job_or_404(session, job_id, principal)
    session.commit()
    export = find_export(settings.runs_dir, job_id, ExportKind.MODEL)
    if export is None:
        raise ApiError(404, f"job {job_id} has no model export", job_id=job_id)
    owner = job.owner or principal.owner
    label = checked_name(name, job.name or f"job {job_id}")
    tree = RegistryLayout(settings.registry_dir).staging_path(".d")
    try:
        copy_export(export, tree)
        summary = _summary(tree)
        stored, _ = _store(
            request, _row(owner, label, summary, job_id), tree, settings, "export", None, principal.owner
        )
    finally:
        remove_path(tree)
    response.headers["Location"] = f"{UPLOAD_PATH}/{stored.id}"
    return stored


def _summary(tree: FilePath) -> ModelSummary:
    try:
        return summarise_model_dir(tree)
    except ArchiveRejected as exc:
        raise ApiError(409, f"the job's exported model cannot be registered: {exc.message}") from None
