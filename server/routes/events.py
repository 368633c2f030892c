"""``GET /jobs/{id}/events``: a job's step records and status changes as Server-Sent Events.

The stream itself is built by :func:`server.streams.events.job_events`; this module checks
the job exists (404 before any byte is streamed), picks the resume point
(``Last-Event-ID`` header, else ``after_step``), and counts the stream in
``app.state.event_streams``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request
from fastapi.responses import StreamingResponse

from server.access import visible_job_or_404
from server.auth import PrincipalDep, authenticate
from server.http.built_routes import add_built_routes
from server.schemas import MAX_STEP_NUMBER, ErrorBody
from server.streams.events import database_poller, job_events
from server.streams.sse import sse_response
from server.streams.stats import EventStreamSettings, StreamStats

router = APIRouter(prefix="/jobs", tags=["events"], dependencies=[Depends(authenticate)])


def install(app: FastAPI, settings: EventStreamSettings | None = None) -> None:
    """Add the events route to ``app`` and its stream bookkeeping (``app.state.event_streams``)."""
    app.state.event_streams = StreamStats(settings or EventStreamSettings())
    add_built_routes(app, router)


def _stream_stats(request: Request) -> StreamStats:
    stats: StreamStats = request.app.state.event_streams
    return stats


@router.get(
    "/{job_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "SSE: `status`, `step` (id = step), `eval`, `rewind` events",
        },
        404: {"model": ErrorBody, "description": "Unknown job"},
    },
)
def job_event_stream(
    job_id: str,
    request: Request,
    principal: PrincipalDep,
    after_step: Annotated[
        int, Query(ge=0, le=MAX_STEP_NUMBER, description="Send step records with step > after_step")
    ] = 0,
    last_event_id: Annotated[
        str | None,
        Header(alias="Last-Event-ID", pattern=r"^\d{1,18}$", description="Resume after this step (set by EventSource)"),
    ] = None,
) -> StreamingResponse:
    """Stream the job's events until it is terminal (see :mod:`server.streams.events` for the event types)."""
    with request.app.state.session_factory() as session:  # closed before streaming starts
        visible_job_or_404(session, job_id, principal)
    start = int(last_event_id) if last_event_id is not None else after_step
    stats = _stream_stats(request)
    poll = database_poller(request.app.state.session_factory, stats.settings.page_size, stats.shared)
    body = job_events(job_id, start, poll, request.is_disconnected, stats)
    return sse_response(body)
