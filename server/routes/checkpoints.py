"""``GET /jobs/{id}/checkpoints`` (list) and ``GET``/``HEAD /jobs/{id}/checkpoints/{name}`` (download): a job's trained weights.

A checkpoint is a ``torch.save`` dict (``model``, ``optimizer``, ``lr_scheduler``,
``precision``, ``step``, ``rng``, ``spec``, …; :mod:`trainer.run.checkpoint`) that loads
with ``torch.load(path, weights_only=True)``; its ``model`` entry is the plain model
state dict. Files come from the API's runs directory (:mod:`server.files.checkpoint_files`);
the same isolation as every job route applies (another owner's job is a 404).
Downloads are plain files: ``Content-Length``, ``ETag``/``Last-Modified`` and byte
``Range`` requests (a broken download resumes) come from Starlette's ``FileResponse``.
``HEAD`` answers the same headers without the body (authenticated like ``GET``: the
bearer token or the dashboard's session cookie), and ``If-None-Match`` naming the
file's ``ETag`` is a ``304`` (:mod:`server.http.conditional`).
"""

from __future__ import annotations

import os
import pathlib
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import FileResponse

from halfcast.contracts.artifacts import CheckpointList, CheckpointPublic
from halfcast.core.db.models import Job
from server.access import visible_job_for_files
from server.auth import PrincipalDep, authenticate
from server.files.checkpoint_files import CHECKPOINT_NAME, CheckpointFile, final_step, find_checkpoint, list_checkpoints
from server.http.conditional import etag_matches, not_modified
from server.http.errors import ApiError
from server.schemas import ErrorBody

router = APIRouter(prefix="/jobs", tags=["checkpoints"], dependencies=[Depends(authenticate)])


def checkpoint_public(job_id: str, file: CheckpointFile) -> CheckpointPublic:
    """The description of checkpoint ``file`` of ``job_id``."""
    return CheckpointPublic(
        attempt=file.attempt,
        name=file.name,
        step=file.step,
        final=file.final,
        size_bytes=file.size_bytes,
        modified_at=file.modified_at,
        url=f"/jobs/{job_id}/checkpoints/{file.name}?attempt={file.attempt}",
    )


_NOT_FOUND: dict[int | str, dict[str, object]] = {
    404: {"model": ErrorBody, "description": "Unknown job, or no such checkpoint"}
}


@router.get("/{job_id}/checkpoints", response_model=CheckpointList, responses=_NOT_FOUND)
def get_checkpoints(job_id: str, request: Request, principal: PrincipalDep) -> CheckpointList:
    """The job's checkpoint files (empty before its first checkpoint)."""
    job = visible_job_for_files(request, job_id, principal)
    files = list_checkpoints(request.app.state.settings.runs_dir, job.id, final_step(job.max_steps, job.end_info))
    return CheckpointList(job_id=job.id, checkpoints=[checkpoint_public(job.id, f) for f in files])


_DOWNLOAD_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {"content": {"application/octet-stream": {}}, "description": "The checkpoint file (HEAD: its headers only)"},
    304: {"description": "`If-None-Match` names the file's `ETag`: the client's copy is current; no body"},
    **_NOT_FOUND,
}


@router.get("/{job_id}/checkpoints/{name}", response_class=FileResponse, responses={**_DOWNLOAD_RESPONSES})
@router.head("/{job_id}/checkpoints/{name}", response_class=FileResponse, responses={**_DOWNLOAD_RESPONSES})
def download_checkpoint(
    job_id: str,
    request: Request,
    principal: PrincipalDep,
    name: Annotated[str, Path(pattern=CHECKPOINT_NAME, description="`final.pt` or `step-<N>.pt`")],
    attempt: Annotated[
        int | None, Query(ge=1, le=10**9, description="Attempt (default: the newest that has the file)")
    ] = None,
) -> Response:
    """The checkpoint file ``name`` (``torch.load(path, weights_only=True)`` reads it); HEAD: its headers only.

    ``If-None-Match`` naming its ``ETag`` (or ``*``) is a 304 without a body.
    """
    job = visible_job_for_files(request, job_id, principal)
    response = _file_response(request.app.state.settings.runs_dir, job, name, attempt)
    if etag_matches(request.headers.get("if-none-match"), response.headers["etag"]):
        return not_modified(response)
    return response


def _file_response(runs_dir: pathlib.Path, job: Job, name: str, attempt: int | None) -> FileResponse:
    """The download of checkpoint ``name`` of ``job``; 404 when there is none (or it was removed since found)."""
    found = find_checkpoint(runs_dir, job.id, name, final_step(job.max_steps, job.end_info), attempt)
    stat = _stat(found.path) if found is not None else None
    if found is None or stat is None:
        where = f"attempt {attempt}" if attempt is not None else "any attempt"
        raise ApiError(404, f"job {job.id} has no checkpoint {name} in {where}", job_id=job.id)
    return FileResponse(
        found.path,
        stat_result=stat,
        media_type="application/octet-stream",
        filename=f"{job.id}-attempt-{found.attempt}-{found.name}",
        headers={"X-Halfcast-Attempt": str(found.attempt), "X-Halfcast-Step": str(found.step)},
    )


def _stat(path: pathlib.Path) -> os.stat_result | None:
    """``path``'s status (size and time give the ETag), or ``None`` if it is gone (a bf16 fallback prunes)."""
    try:
        return path.stat()
    except FileNotFoundError:
        return None
