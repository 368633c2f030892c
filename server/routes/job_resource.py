"""``GET /jobs/{id}``: the job resource, made cheap to poll.

Dashboards, Grafana and scripts poll this route, so it reads with one statement (the
token, the job row and its attempts: ``app.state.job_reads``, :mod:`halfcast.core.db.job_readers`;
in the event loop on PostgreSQL, in one trip to a worker thread on SQLite), instead of a
token lookup, a job read and an attempts read in sessions of their own, and a ``GET``
skips FastAPI's routing and dependency solving (:mod:`server.routes.job_poll`; both
paths answer with :func:`job_response`). It checks the token itself (the same answers as
:func:`server.auth.authenticate`) and the visibility rule, then answers with a strong
``ETag`` (:mod:`server.http.etags`): a request whose ``If-None-Match`` holds the current
tag gets ``304 Not Modified`` with no body, and the resource is only built and
serialised (by pydantic, straight to JSON bytes) when it changed.

Since a tag determines the bytes, the last :data:`RENDERED_KEPT` bodies are kept by
tag (:class:`RenderedBodies`, ``app.state.rendered_bodies``, per process): the many pollers of a running job that
ask between two of its step records get the body rendered for the first of them,
and only a new state is built and serialised again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials

from halfcast.core.db.job_reads import JobView
from server.auth import bearer, can_see, presented_token_hash, principal_of
from server.http.errors import ApiError
from server.http.etags import job_etag, none_match
from server.schemas import ErrorBody, JobPublic, job_public

router = APIRouter(prefix="/jobs", tags=["jobs"])

#: Caching headers of the resource: any cache must revalidate (the job changes), and only the caller's own may keep it.
CACHE_CONTROL = "private, no-cache"
#: Rendered bodies kept per API process (a few KiB each): enough for every job polled at once on a busy server.
RENDERED_KEPT = 512


class RenderedBodies:
    """The JSON bodies of the last ``kept`` job states rendered, by their ``ETag`` (least recently used out first).

    Used from the event loop only (not thread-safe). A tag is a hash of everything
    the body is built from (:mod:`server.http.etags`), so a kept body is the body.
    """

    def __init__(self, kept: int = RENDERED_KEPT) -> None:
        self.kept = kept
        self._bodies: OrderedDict[str, bytes] = OrderedDict()
        #: Tags by view object (holding the view, so its id is not reused while it is here).
        self._tags: OrderedDict[int, tuple[JobView, str]] = OrderedDict()

    def tag(self, job: JobView) -> str:
        """``job``'s ``ETag``, hashed once per view object: a kept read answers many polls with the same view."""
        seen = self._tags.get(id(job))
        if seen is not None and seen[0] is job:
            self._tags.move_to_end(id(job))
            return seen[1]
        etag = job_etag(job)
        self._tags[id(job)] = (job, etag)
        if len(self._tags) > self.kept:
            self._tags.popitem(last=False)
        return etag

    def body(self, etag: str, job: JobView) -> bytes:
        """The body of ``job``, whose tag is ``etag``: the kept one, else rendered now and kept."""
        body = self._bodies.get(etag)
        if body is not None:
            self._bodies.move_to_end(etag)
            return body
        body = job_public(job).model_dump_json().encode()
        self._bodies[etag] = body
        if len(self._bodies) > self.kept:
            self._bodies.popitem(last=False)
        return body

    def __len__(self) -> int:
        return len(self._bodies)


_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {
        "headers": {"ETag": {"description": "Strong tag of this state of the resource", "schema": {"type": "string"}}}
    },
    304: {"description": "Not modified: `If-None-Match` holds the current `ETag` (no body)"},
    401: {"model": ErrorBody, "description": "No token, or a malformed, unknown or revoked one"},
    404: {"model": ErrorBody, "description": "Unknown job"},
    503: {"model": ErrorBody, "description": "The database is unreachable or busy, or the server is overloaded"},
}


@router.get("/{job_id}", response_model=JobPublic, responses=_RESPONSES)
async def get_job(
    job_id: str,
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    if_none_match: Annotated[  # unconstrained: a caller without a valid token gets its 401 before any 422
        str | None, Header(alias="If-None-Match", description="ETags the caller has; 304 if one is current")
    ] = None,
) -> Response:
    """The job resource with its ``ETag``; ``304`` when ``If-None-Match`` has it; ``404`` for a job the caller cannot see."""
    return await job_response(request, job_id, credentials, if_none_match)


async def job_response(
    request: Request, job_id: str, credentials: HTTPAuthorizationCredentials | None, if_none_match: str | None
) -> Response:
    """The answer of :func:`get_job`. Raises ``ApiError`` 401/404 (and the database's errors: 503 by their handlers)."""
    token_hash = presented_token_hash(request, credentials)
    read = await request.app.state.job_reads.read(job_id, token_hash)
    principal = principal_of(read.token, token_hash)
    if read.job is None or not can_see(principal, read.job):
        raise ApiError(404, f"job {job_id} not found", job_id=job_id)
    bodies: RenderedBodies = request.app.state.rendered_bodies
    etag = bodies.tag(read.job)
    headers = {"ETag": etag, "Cache-Control": CACHE_CONTROL}
    if none_match(if_none_match, etag):
        return Response(status_code=304, headers=headers)
    return Response(bodies.body(etag, read.job), media_type="application/json", headers=headers)


def resource_route() -> APIRoute:
    """The route of :func:`get_job` (``GET /jobs/{job_id}``)."""
    return next(route for route in router.routes if isinstance(route, APIRoute) and route.endpoint is get_job)
