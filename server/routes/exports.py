"""``GET /jobs/{id}/exports`` (list) and ``GET /jobs/{id}/exports/{kind}`` (download): a job's exported model.

An export is a directory the trainer writes for a successful job: ``adapter`` (a PEFT
adapter) or ``model`` (a merged Hugging Face model directory) (:mod:`halfcast.files.export_files`).
A download is that directory as an uncompressed tar, streamed (:mod:`halfcast.files.export_tar`)
with an exact ``Content-Length``; ``HEAD`` answers the same headers without reading a file.
The same isolation as every job route applies (another owner's job is a 404).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import Response, StreamingResponse

from halfcast.contracts.artifacts import ExportFilePublic, ExportList, ExportPublic
from halfcast.files.export_files import Export, ExportKind, find_export, list_exports
from halfcast.files.export_tar import archive_size, stream_archive
from server.access import visible_job_for_files
from server.auth import PrincipalDep, authenticate
from server.files.export_check import recorded_check
from server.http.errors import ApiError
from server.schemas import ErrorBody

router = APIRouter(prefix="/jobs", tags=["exports"], dependencies=[Depends(authenticate)])

#: Media type of a download.
TAR_MEDIA_TYPE = "application/x-tar"


def export_public(job_id: str, export: Export) -> ExportPublic:
    """The description of ``export`` of ``job_id``."""
    files = [ExportFilePublic(name=f.name, size_bytes=f.size_bytes) for f in export.files]
    url = f"/jobs/{job_id}/exports/{export.kind.value}?attempt={export.attempt}"
    return ExportPublic(
        kind=export.kind,
        attempt=export.attempt,
        files=files,
        size_bytes=export.size_bytes,
        modified_at=export.modified_at,
        url=url,
        check=recorded_check(export) if export.kind is ExportKind.MODEL else None,
    )


_NOT_FOUND: dict[int | str, dict[str, object]] = {
    404: {"model": ErrorBody, "description": "Unknown job, or no such export"}
}


@router.get("/{job_id}/exports", response_model=ExportList, responses=_NOT_FOUND)
def get_exports(job_id: str, request: Request, principal: PrincipalDep) -> ExportList:
    """The job's exports (empty until a successful job has written one)."""
    job = visible_job_for_files(request, job_id, principal)
    found = list_exports(request.app.state.settings.runs_dir, job.id)
    return ExportList(job_id=job.id, exports=[export_public(job.id, e) for e in found])


@router.head("/{job_id}/exports/{kind}", include_in_schema=False)
@router.get(
    "/{job_id}/exports/{kind}",
    response_class=StreamingResponse,
    responses={200: {"content": {TAR_MEDIA_TYPE: {}}, "description": "The export as a tar"}, **_NOT_FOUND},
)
def download_export(
    job_id: str,
    request: Request,
    principal: PrincipalDep,
    kind: Annotated[ExportKind, Path(description="`adapter` or `model`")],
    attempt: Annotated[
        int | None, Query(ge=1, le=10**9, description="Attempt (default: the newest that has it)")
    ] = None,
) -> Response:
    """The export ``kind`` as an uncompressed tar of ``<kind>/<file>`` entries (extract with ``tar -xf``)."""
    job = visible_job_for_files(request, job_id, principal)
    export = find_export(request.app.state.settings.runs_dir, job.id, kind, attempt)
    if export is None:
        where = f"attempt {attempt}" if attempt is not None else "any attempt"
        raise ApiError(404, f"job {job.id} has no {kind.value} export in {where}", job_id=job.id)
    headers = {
        "Content-Length": str(archive_size(export)),
        "Content-Disposition": f'attachment; filename="{job.id}-{kind.value}.tar"',
        "X-Halfcast-Attempt": str(export.attempt),
    }
    if request.method == "HEAD":
        return Response(media_type=TAR_MEDIA_TYPE, headers=headers)
    return StreamingResponse(stream_archive(export), media_type=TAR_MEDIA_TYPE, headers=headers)
