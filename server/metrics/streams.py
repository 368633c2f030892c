"""The streams' series: ``halfcast_<kind>_streams`` and their polls and reads counters (docs/api.md)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from server.streams.stats import StreamStats


class StreamCollector:
    """Prometheus collector of :class:`StreamStats`: ``halfcast_<kind>_streams`` and its polls counter.

    ``kind`` is ``event`` (``GET /jobs/{id}/events``) or ``log`` (``GET /jobs/{id}/logs?follow=true``).
    """

    def __init__(self, stats: StreamStats, kind: str = "event") -> None:
        self.stats = stats
        self.kind = kind

    def collect(self) -> Iterator[Metric]:
        """The gauge of open streams and the counter of their database polls."""
        name = f"halfcast_{self.kind}_stream"
        yield GaugeMetricFamily(f"{name}s", f"Open job {self.kind} streams (SSE)", value=self.stats.active)
        yield CounterMetricFamily(f"{name}_polls", f"Polls made by job {self.kind} streams", value=self.stats.polls)
        yield CounterMetricFamily(
            f"{name}_reads",
            f"Database reads made for job {self.kind} streams (polls of one job at one tick share one)",
            value=self.stats.shared.reads,
        )
