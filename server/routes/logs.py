"""``GET /jobs/{id}/logs``: the last lines of one rank's log of one attempt, or a live follow of it.

The files are read from the API's own runs directory (:mod:`halfcast.contracts.rundir`); with
the API and the workers on different hosts that directory must be shared (the
docker-compose file mounts one volume in both). Without ``follow`` the answer is
JSON (:class:`LogLines`); with ``follow=true`` it is a Server-Sent Events stream
(:mod:`server.streams.logstream`), counted in ``app.state.log_streams``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse

from halfcast.contracts.resources import LogLines
from halfcast.core.db.models import TERMINAL_STATUSES, Job
from server.access import visible_job_for_files
from server.auth import PrincipalDep, authenticate
from server.http.built_routes import add_built_routes
from server.http.errors import ApiError
from server.schemas import ErrorBody
from server.streams.logstream import LogTarget, database_state_poller, follow_log
from server.streams.logtail import read_tail
from server.streams.sse import sse_response
from server.streams.stats import EventStreamSettings, StreamStats

router = APIRouter(prefix="/jobs", tags=["logs"], dependencies=[Depends(authenticate)])

#: Most lines one request may ask for.
MAX_TAIL = 10_000
#: Lines returned when ``tail`` is not given.
DEFAULT_TAIL = 200


def install(app: FastAPI, settings: EventStreamSettings | None = None) -> None:
    """Add the logs route to ``app`` and the bookkeeping of its follow streams (``app.state.log_streams``)."""
    app.state.log_streams = StreamStats(settings or EventStreamSettings())
    add_built_routes(app, router)


def _query_error(name: str, message: str, value: object) -> RequestValidationError:
    """A 422 naming the query parameter ``name`` (FastAPI's format)."""
    return RequestValidationError([{"type": "value_error", "loc": ("query", name), "msg": message, "input": value}])


def _check(job: Job, rank: int, attempt: int | None, follow: bool) -> None:
    """422 for a rank or attempt the job does not have; 409/404 for a job that never ran (unless following)."""
    if rank >= job.world_size:
        raise _query_error("rank", f"the job has ranks 0..{job.world_size - 1} (world size {job.world_size})", rank)
    if attempt is not None and attempt > job.attempt:
        raise _query_error("attempt", f"the job has {job.attempt} attempt(s) so far", attempt)
    if job.attempt == 0 and not follow:
        if job.status in TERMINAL_STATUSES:
            raise ApiError(404, f"job {job.id} never started ({job.status}): it has no logs", job_id=job.id)
        raise ApiError(409, f"job {job.id} has no logs yet: it is {job.status}", job_id=job.id)


_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {
        "content": {"text/event-stream": {}},
        "description": "`LogLines` JSON; with `follow=true`, SSE: `attempt`, `lines`, `end`",
    },
    404: {"model": ErrorBody, "description": "Unknown job, or a job that ended without ever starting"},
    409: {"model": ErrorBody, "description": "The job has not started yet (not with `follow=true`: that waits)"},
}


@router.get("/{job_id}/logs", response_model=LogLines, responses=_RESPONSES)
def job_logs(
    job_id: str,
    request: Request,
    principal: PrincipalDep,
    rank: Annotated[int, Query(ge=0, description="Global rank (0..world_size-1)")] = 0,
    tail: Annotated[
        int, Query(ge=0, le=MAX_TAIL, description="Last lines to return (to start with, when following)")
    ] = DEFAULT_TAIL,
    attempt: Annotated[int | None, Query(ge=1, description="Attempt (1-based); default the newest")] = None,
    follow: Annotated[bool, Query(description="Stream new lines (SSE) until the job ends")] = False,
) -> LogLines | StreamingResponse:
    """The last ``tail`` lines of ``rank``'s stdout and stderr in ``attempt``, or a live follow of them."""
    job = visible_job_for_files(request, job_id, principal)
    _check(job, rank, attempt, follow)
    runs_dir = request.app.state.settings.runs_dir
    target = LogTarget(job_id, rank, runs_dir, attempt, tail)
    if follow:
        stats: StreamStats = request.app.state.log_streams
        poll = database_state_poller(request.app.state.session_factory, stats.shared)
        body = follow_log(target, poll, request.is_disconnected, stats)
        return sse_response(body)
    number = attempt or job.attempt
    try:
        lines = read_tail(target.path(number), tail).lines
    except FileNotFoundError:
        lines = []
    return LogLines(job_id=job_id, attempt=number, rank=rank, lines=lines)
