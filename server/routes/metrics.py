"""``GET /metrics``: Prometheus exposition of the app's registry.

The format follows the scraper's ``Accept`` header: the Prometheus text format by
default, OpenMetrics when asked for.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.exposition import choose_encoder

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def metrics(request: Request) -> Response:
    """Current Prometheus series (built from the database at scrape time)."""
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(encoder(request.app.state.registry), media_type=content_type)
