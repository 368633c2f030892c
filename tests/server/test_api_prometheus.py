"""GET /metrics: Prometheus series built from the database at scrape time."""

from __future__ import annotations

from typing import Any

import prometheus_client
from api_support import insert_job
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db.models import STATUSES, Job

PER_JOB = {
    "halfcast_loss_scale": "loss_scale",
    "halfcast_skipped_steps_total": "skipped_steps",
    "halfcast_optimizer_steps_total": "step",
    "halfcast_samples_per_second": "samples_per_second",
    "halfcast_tokens_per_second": "tokens_per_second",
    "halfcast_train_loss": "loss",
}


def record(step: int, **fields: Any) -> dict[str, Any]:
    base = {
        "step": step,
        "time": 1.0,
        "loss": 2.0 / step,
        "loss_scale": 2.0**14,
        "overflow": False,
        "skipped_steps": 4,
        "grad_norm": 0.7,
        "lr": 1e-3,
        "samples_per_second": 900.0,
        "tokens_per_second": None,
    }
    return base | fields


def scrape(client: TestClient) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``{sample name: {labels: value}}`` of one scrape."""
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_series_only_for_live_jobs_with_values_of_the_latest_record(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    running = insert_job(sessions, status="running", latest=record(120, skipped_steps=7), seconds=1)
    cancelling = insert_job(sessions, status="cancelling", latest=record(30, tokens_per_second=51200.0), seconds=2)
    insert_job(sessions, status="queued", seconds=3)  # no record yet: no per-job series
    for status in ("succeeded", "failed", "cancelled"):
        insert_job(sessions, status=status, latest=record(99), seconds=4)

    samples = scrape(client)

    latest = {running: record(120, skipped_steps=7), cancelling: record(30, tokens_per_second=51200.0)}
    for name, field in PER_JOB.items():
        expected = {
            (("job_id", job_id),): float(values[field])
            for job_id, values in latest.items()
            if values[field] is not None
        }
        assert samples.get(name, {}) == expected, name
    assert samples["halfcast_skipped_steps_total"][(("job_id", running),)] == 7.0
    assert samples["halfcast_optimizer_steps_total"][(("job_id", running),)] == 120.0


def test_job_counts_cover_every_status_and_queue_depth(client: TestClient, sessions: sessionmaker[Session]) -> None:
    for status, count in (("queued", 3), ("running", 1), ("failed", 2)):
        for _ in range(count):
            insert_job(sessions, status=status)

    samples = scrape(client)

    expected = {status: 0.0 for status in STATUSES} | {"queued": 3.0, "running": 1.0, "failed": 2.0}
    assert samples["halfcast_jobs"] == {(("status", status),): value for status, value in expected.items()}
    assert samples["halfcast_queue_depth"] == {(): 3.0}


def test_series_follow_the_database_between_scrapes(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions, status="running", latest=record(10))
    assert scrape(client)["halfcast_loss_scale"] == {(("job_id", job_id),): 2.0**14}

    with sessions() as session:
        session.execute(update(Job).where(Job.id == job_id).values(latest=record(11, loss_scale=2.0**13)))
        session.commit()
    assert scrape(client)["halfcast_loss_scale"] == {(("job_id", job_id),): 2.0**13}

    with sessions() as session:
        session.execute(update(Job).where(Job.id == job_id).values(status="succeeded"))
        session.commit()
    samples = scrape(client)
    assert "halfcast_loss_scale" not in samples
    assert "halfcast_optimizer_steps_total" not in samples


def test_missing_fields_are_left_out_not_zeroed(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions, status="running", latest={"step": 3, "loss": None, "loss_scale": 8.0})

    samples = scrape(client)

    assert samples["halfcast_loss_scale"] == {(("job_id", job_id),): 8.0}
    assert "halfcast_train_loss" not in samples
    assert "halfcast_samples_per_second" not in samples


def test_the_global_registry_is_not_used(client: TestClient, sessions: sessionmaker[Session]) -> None:
    insert_job(sessions, status="running", latest=record(1))
    scrape(client)

    global_text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()

    assert "halfcast_" not in global_text


def test_openmetrics_is_served_when_asked_for(client: TestClient, sessions: sessionmaker[Session]) -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

    job_id = insert_job(sessions, status="running", latest=record(5))

    response = client.get("/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})

    assert response.headers["content-type"].startswith("application/openmetrics-text")
    families = {family.name: family for family in parse_openmetrics(response.text)}
    assert families["halfcast_optimizer_steps"].type == "counter"
    assert families["halfcast_optimizer_steps"].samples[0].labels == {"job_id": job_id}
    assert families["halfcast_optimizer_steps"].samples[0].value == 5.0


def test_request_latency_histogram_is_labelled_by_route_template(client: TestClient) -> None:
    client.get("/jobs/00000000-0000-0000-0000-000000000000")  # 404 from the route
    client.get("/jobs")
    client.get("/no/such/route")
    samples = scrape(client)["halfcast_http_request_duration_seconds_count"]
    routes = {dict(labels)["route"]: dict(labels) for labels in samples}
    assert routes["/jobs/{job_id}"]["status"] == "404" and routes["/jobs"]["status"] == "200"
    assert routes["unmatched"]["method"] == "GET"
    assert not any("0000" in route for route in routes)  # never the raw path
