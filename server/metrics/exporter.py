"""Prometheus exposition built at scrape time from the database (docs/api.md, "Prometheus series").

One collector reads the ``jobs`` table on every scrape and yields per-job series
only for jobs not yet terminal, so label cardinality is bounded by live jobs and a
finished job's series simply disappear (no multiprocess files, no stale labels).

Series (values from each live job's ``latest`` step record; a live job without a
step record yet has no per-job series):

- ``halfcast_loss_scale{job_id}`` gauge: loss scale used for the latest step (1.0 without scaling).
- ``halfcast_skipped_steps_total{job_id}`` counter: optimizer steps skipped on overflow.
- ``halfcast_optimizer_steps_total{job_id}`` counter: *attempted* optimizer steps (the
  latest step number). Skipped steps are a subset of attempted ones, so
  ``rate(halfcast_skipped_steps_total[5m]) / rate(halfcast_optimizer_steps_total[5m])``
  is the skip ratio.
- ``halfcast_samples_per_second{job_id}``, ``halfcast_tokens_per_second{job_id}`` (token
  datasets only), ``halfcast_train_loss{job_id}`` gauges.
- ``halfcast_jobs{status}`` gauge for every status (0 included), ``halfcast_queue_depth``
  gauge (jobs waiting in ``queued``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db import jobs as repo

#: (metric name, kind, step-record field, help) of the per-job series.
_JOB_SERIES: tuple[tuple[str, str, str, str], ...] = (
    (
        "halfcast_loss_scale",
        "gauge",
        "loss_scale",
        "Loss scale used for the latest optimizer step (1.0 without scaling)",
    ),
    ("halfcast_skipped_steps", "counter", "skipped_steps", "Optimizer steps skipped because gradients overflowed"),
    ("halfcast_optimizer_steps", "counter", "step", "Attempted optimizer steps (skipped steps included)"),
    ("halfcast_samples_per_second", "gauge", "samples_per_second", "Training throughput in samples per second"),
    ("halfcast_tokens_per_second", "gauge", "tokens_per_second", "Training throughput in tokens per second"),
    ("halfcast_train_loss", "gauge", "loss", "Training loss of the latest optimizer step"),
)

JobLatest = tuple[str, Mapping[str, object] | None]


def _number(value: object) -> float | None:
    """``value`` as a float if it is a real number (bools and missing values are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _family(name: str, kind: str, documentation: str, labels: list[str]) -> GaugeMetricFamily | CounterMetricFamily:
    if kind == "counter":
        return CounterMetricFamily(name, documentation, labels=labels)
    return GaugeMetricFamily(name, documentation, labels=labels)


def job_families(live_jobs: Iterable[JobLatest]) -> Iterator[Metric]:
    """Per-job families for live jobs ``(job_id, latest step record or None)``."""
    live = list(live_jobs)
    for name, kind, field, documentation in _JOB_SERIES:
        family = _family(name, kind, documentation, ["job_id"])
        for job_id, latest in live:
            value = _number(latest.get(field)) if latest else None
            if value is not None:
                family.add_metric([job_id], value)
        yield family


def status_families(counts: Mapping[str, int]) -> Iterator[Metric]:
    """``halfcast_jobs{status}`` for every status and ``halfcast_queue_depth``."""
    jobs = GaugeMetricFamily("halfcast_jobs", "Jobs by status", labels=["status"])
    for status, count in counts.items():
        jobs.add_metric([status], count)
    yield jobs
    yield GaugeMetricFamily("halfcast_queue_depth", "Jobs waiting to be started", value=counts.get("queued", 0))


class JobMetricsCollector(Collector):
    """Reads the database on each scrape; database errors propagate to the caller."""

    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self._session_factory = session_factory

    def describe(self) -> Iterable[Metric]:
        """The families without samples (so registering never touches the database)."""
        return [*job_families([]), *status_families({})]

    def collect(self) -> Iterable[Metric]:
        """Current series: job counts by status, queue depth, and per-job series of live jobs."""
        with self._session_factory() as session:
            counts = repo.count_by_status(session)
            live = repo.live_job_latest(session)
        return [*status_families(counts), *job_families(live)]


def build_registry(session_factory: sessionmaker[Session]) -> CollectorRegistry:
    """A fresh registry (never the global one) holding only :class:`JobMetricsCollector`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobMetricsCollector(session_factory))
    return registry
