"""A real Prometheus server (Debian's ``prometheus``) scraping the API during a job.

Prometheus scrapes ``/metrics`` every second while an fp16 job runs with injected
overflows (so its loss scale changes). Afterwards the raw samples of
``halfcast_loss_scale{job_id=...}`` and ``halfcast_optimizer_steps_total{job_id=...}``
are read back through Prometheus' HTTP API: at every scrape, the loss scale must
equal the ``loss_scale`` of the step record whose step the same scrape reported,
and every query of the Grafana dashboard must run. Skipped without the
``prometheus`` binary, unless ``HALFCAST_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2e_support import ROOT, Stack, free_port, load_example

pytestmark = pytest.mark.e2e

DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "halfcast.json"


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"no `{name}` binary (apt-get install -y prometheus)"
        if os.environ.get("HALFCAST_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def prometheus(embedded_stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """A Prometheus server scraping the stack's API every second; a client of its HTTP API."""
    binary = _binary("prometheus")
    folder = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "halfcast-api",
                "static_configs": [{"targets": [f"127.0.0.1:{embedded_stack.port}"]}],
                "authorization": {"credentials_file": str(folder / "token")},
            }
        ],  # /metrics needs an admin token
    }
    assert embedded_stack.token is not None
    (folder / "token").write_text(embedded_stack.token)
    (folder / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    log = (folder / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.get("/-/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"prometheus did not start:\n{(folder / 'prometheus.log').read_text()[-3000:]}")
            time.sleep(0.2)
        yield client
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=30)
        log.close()


def _query(prometheus: httpx.Client, expr: str) -> list[dict[str, Any]]:
    response = prometheus.get("/api/v1/query", params={"query": expr})
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", (expr, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _raw_samples(prometheus: httpx.Client, metric: str, job_id: str) -> dict[float, float]:
    """``{scrape timestamp: value}`` of one job's series over the last 10 minutes."""
    result = _query(prometheus, f'{metric}{{job_id="{job_id}"}}[10m]')
    assert len(result) == 1, result
    return {float(ts): float(value) for ts, value in result[0]["values"]}


def _dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    queries = [target["expr"] for panel in panels for target in panel.get("targets", []) if "expr" in target]
    return [query.replace("$job_id", ".*") for query in queries]


def test_prometheus_sees_the_loss_scale_of_the_step_records(embedded_stack: Stack, prometheus: httpx.Client) -> None:
    spec = load_example(
        "synthetic-fp16.json",
        max_steps=40,
        log_interval=1,
        faults={"sleep_per_step_s": 0.25, "nonfinite_grad_steps": [10, 20, 30]},
    )
    spec["loss_scale"] = {"mode": "dynamic", "init_scale": 65536, "growth_interval": 1000}
    job = embedded_stack.submit(spec)
    embedded_stack.wait(job["id"], lambda j: j["step"] >= 5, timeout_s=180)
    live = _query(prometheus, f'halfcast_loss_scale{{job_id="{job["id"]}"}}')
    deadline = time.monotonic() + 15
    while not live and time.monotonic() < deadline:  # the next scrape
        time.sleep(0.5)
        live = _query(prometheus, f'halfcast_loss_scale{{job_id="{job["id"]}"}}')
    assert live and live[0]["metric"]["job"] == "halfcast-api"
    for query in _dashboard_queries():  # every Grafana panel query runs against the live series
        _query(prometheus, query)
    finished = embedded_stack.wait_terminal(job["id"])
    assert finished["status"] == "succeeded", finished["error"]
    time.sleep(2.5)  # a scrape after the end: the job's series are gone from /metrics

    records = {point["step"]: point for point in embedded_stack.metric_points(job["id"])}
    scales = _raw_samples(prometheus, "halfcast_loss_scale", job["id"])
    steps = _raw_samples(prometheus, "halfcast_optimizer_steps_total", job["id"])
    assert scales.keys() == steps.keys() and len(scales) >= 5, (scales, steps)
    for at, scale in scales.items():  # one scrape reads one latest record: its step and scale belong together
        assert scale == records[int(steps[at])]["loss_scale"], (at, scale, steps[at])
    assert set(scales.values()) >= {65536.0, 32768.0}, scales  # the scale changed while Prometheus watched
    assert sorted(steps.values()) == list(steps.values()), "steps went backwards"
    assert _query(prometheus, f'halfcast_loss_scale{{job_id="{job["id"]}"}}') == [], (
        "a finished job's series is still live"
    )
