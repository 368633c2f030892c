"""Prometheus series of the worker roster, built at scrape time (``GET /metrics``).

Per registered worker (heard from within ``HALFCAST_WORKER_FORGET_S``, so cardinality is
bounded by the workers of the last few minutes):

- ``halfcast_worker_up{worker_id}`` gauge: 1 if its heartbeat is younger than
  ``HALFCAST_WORKER_LIVE_S``, else 0;
- ``halfcast_worker_last_heartbeat_timestamp_seconds{worker_id}`` gauge: unix time of
  its last heartbeat (alert on ``time() - halfcast_worker_last_heartbeat_timestamp_seconds > 30``);
- ``halfcast_worker_gpus{worker_id}`` and ``halfcast_worker_running_jobs{worker_id}`` gauges.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker

from halfcast.common.timeutil import as_utc
from halfcast.core.db.workers import WorkerState, list_workers


def worker_families(workers: Iterable[WorkerState]) -> Iterator[Metric]:
    """The four per-worker families for ``workers``."""
    up = GaugeMetricFamily("halfcast_worker_up", "1 if the worker's heartbeat is recent, else 0", labels=["worker_id"])
    heartbeat = GaugeMetricFamily(
        "halfcast_worker_last_heartbeat_timestamp_seconds",
        "Unix time of the worker's last heartbeat",
        labels=["worker_id"],
    )
    gpus = GaugeMetricFamily("halfcast_worker_gpus", "GPUs the worker may hand to jobs", labels=["worker_id"])
    running = GaugeMetricFamily(
        "halfcast_worker_running_jobs", "Jobs of the worker not yet terminal", labels=["worker_id"]
    )
    for worker in workers:
        labels = [worker.row.id]
        up.add_metric(labels, 1.0 if worker.live else 0.0)
        heartbeat.add_metric(labels, as_utc(worker.row.heartbeat_at).timestamp())
        gpus.add_metric(labels, float(len(worker.row.gpus or [])))
        running.add_metric(labels, float(len(worker.running_jobs)))
    yield from (up, heartbeat, gpus, running)


class WorkerMetricsCollector(Collector):
    """Reads the ``workers`` table on each scrape; database errors propagate to the caller."""

    def __init__(self, session_factory: sessionmaker[Session], live_s: float, forget_s: float) -> None:
        self._session_factory = session_factory
        self._live_s = live_s
        self._forget_s = forget_s

    def describe(self) -> Iterable[Metric]:
        """The families without samples (registering never touches the database)."""
        return list(worker_families([]))

    def collect(self) -> Iterable[Metric]:
        """Current per-worker series."""
        with self._session_factory() as session:
            workers = list_workers(session, datetime.now(UTC), self._live_s, self._forget_s)
        return list(worker_families(workers))
