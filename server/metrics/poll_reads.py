"""The kept poll reads' series (docs/api.md): where ``GET /jobs/{id}`` got its reads, and the change feed's state.

Only exposed when polls keep reads (``HALFCAST_POLL_READS=notified``, PostgreSQL's default, or
``HALFCAST_POLL_MAX_AGE_S``), the feed's only with ``notified``. Counted by the app's own objects in plain
integers: nothing per request here.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from halfcast.core.db.change_feed import ChangeFeed
from server.http.recent_reads import RecentJobReads


class PollReadsCollector:
    """``halfcast_poll_reads_total{answered_from}`` and, with a feed, ``halfcast_poll_change_feed_*``.

    Either may be ``None`` (polls keep no reads; no feed): its series are then left out.
    """

    def __init__(self, reads: RecentJobReads | None, feed: ChangeFeed | None) -> None:
        self.reads = reads
        self.feed = feed

    def collect(self) -> Iterator[Metric]:
        """The reads counter, the feed's gauge and its losses counter (each only when there is one)."""
        reads = self.reads
        if reads is not None:
            answered = CounterMetricFamily(
                "halfcast_poll_reads",
                "GET /jobs/{id} reads by where they came from: kept, another poll's database read, or their own",
                labels=["answered_from"],
            )
            answered.add_metric(["kept"], reads.answered_kept)
            answered.add_metric(["shared"], reads.answered_shared)
            answered.add_metric(["database"], reads.answered_read)
            yield answered
        feed = self.feed
        if feed is not None:
            yield GaugeMetricFamily(
                "halfcast_poll_change_feed_listening",
                "1 while the API listens for changes of what GET /jobs/{id} reads, else 0 (reads then not kept)",
                value=int(feed.listening),
            )
            yield CounterMetricFamily(
                "halfcast_poll_change_feed_losses",
                "Times the API's listening connection was lost (it connects again)",
                value=feed.losses,
            )
