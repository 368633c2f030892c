"""API request latency as a Prometheus histogram (``halfcast_http_request_duration_seconds``).

Labels are the HTTP method, the matched route *template* (``/jobs/{job_id}``, never the
raw path, so cardinality is bounded by the routes) and the status code. The duration is
time to the response start (status and headers sent): for streaming responses
(``/jobs/{id}/events``, logs with ``follow``) it is the time to first byte, not the
stream's lifetime. Requests that match no route are labelled ``route="unmatched"``.
"""

from __future__ import annotations

import time

from prometheus_client import Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Histogram buckets in seconds (5 ms to 10 s).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def request_histogram() -> Histogram:
    """A new, unregistered histogram (the app registers it in its own registry)."""
    return Histogram(
        "halfcast_http_request_duration_seconds",
        "API request latency to the response start, by method, route template and status",
        labelnames=("method", "route", "status"),
        buckets=BUCKETS,
        registry=None,
    )


class RequestMetricsMiddleware:
    """Observes every HTTP request's time to response start into ``histogram``."""

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram
        #: The histogram's child per label values (``labels()`` validates and locks at every call; a few dozen at most).
        self._children: dict[tuple[str, str, str], Histogram] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, timing it until ``http.response.start``."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                route = scope.get("route")
                template = getattr(route, "path", None) or "unmatched"
                labels = (scope["method"], template, str(message["status"]))
                child = self._children.get(labels)
                if child is None:
                    child = self._children[labels] = self.histogram.labels(*labels)
                child.observe(time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, timed_send)
