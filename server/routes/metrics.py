"""``GET /metrics``: Prometheus exposition of the app's registry.

The format follows the scraper's ``Accept`` header: the Prometheus text format by
default, OpenMetrics when asked for. It needs an admin token (the series name every
owner's jobs): give Prometheus one with ``authorization: {credentials_file: ...}``.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.exposition import choose_encoder

from server.auth import require_admin

router = APIRouter(tags=["metrics"], dependencies=[Depends(require_admin)])


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def metrics(request: Request) -> Response:
    """Current Prometheus series (built from the database at scrape time)."""
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(encoder(request.app.state.registry), media_type=content_type)
