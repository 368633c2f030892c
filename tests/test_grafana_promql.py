"""Every query of the provisioned Grafana dashboard is valid PromQL (``promtool``) over metrics the API exports.

The queries (panels and template variables) are written into a rules file as
recording rules and checked with ``promtool check rules``; Grafana's variables are
replaced first (``$job_id`` by ``.*``). The metric names they use are compared with
what the exporter really emits for a live job, not with a list kept by hand.
Skipped without ``promtool`` (Debian's ``prometheus``), unless ``HALFCAST_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest
from prometheus_client import CollectorRegistry

from halfcast.core.db.async_pool import Connect
from halfcast.core.db.change_feed import ChangeFeed
from halfcast.core.db.job_readers import JobReads
from halfcast.core.db.models import Worker
from halfcast.core.db.workers import WorkerState
from server.http.recent_reads import RecentJobReads
from server.http.request_metrics import request_histogram
from server.metrics.exporter import job_families, status_families
from server.metrics.poll_reads import PollReadsCollector
from server.metrics.worker_metrics import worker_families

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))
#: Grafana's variables and what stands in for them in a plain PromQL check.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("HALFCAST_REQUIRE_SERVICES") == "1":
            pytest.fail("no promtool (apt-get install -y prometheus)")
        pytest.skip("no promtool (apt-get install -y prometheus)")
    return path


def dashboard_queries(path: Path) -> list[str]:
    """Every PromQL query of a dashboard (panel targets, nested panels, query variables), variables replaced."""
    dashboard = json.loads(path.read_text())
    queries: list[str] = []

    def panels(items: list[dict]) -> None:
        for panel in items:
            queries.extend(target["expr"] for target in panel.get("targets", []) if target.get("expr"))
            panels(panel.get("panels", []))

    panels(dashboard.get("panels", []))
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        text = query.get("query") if isinstance(query, dict) else query
        if variable.get("type") == "query" and text:
            match = re.fullmatch(r"label_values\((.+),\s*\w+\)", text.strip())
            queries.append(match.group(1) if match else text)  # label_values(expr, label) is Grafana's; check expr
    return [_substitute(query) for query in queries]


def _substitute(query: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        query = query.replace(name, value)
    return re.sub(r"\$\{?\w+(:\w+)?\}?", ".*", query)


def _check_rules(promtool: str, queries: list[str], folder: Path) -> subprocess.CompletedProcess[str]:
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:query_{n}", "expr": q} for n, q in enumerate(queries)],
            }
        ]
    }
    path = folder / "rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    return subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


def exported_names() -> set[str]:
    """Sample names the exporter emits for a live job with every field (tokens included)."""
    latest = {
        "step": 3,
        "loss": 0.5,
        "loss_scale": 1024.0,
        "skipped_steps": 1,
        "samples_per_second": 10.0,
        "tokens_per_second": 99.0,
    }
    registry = CollectorRegistry()
    latency = request_histogram()
    latency.labels("GET", "/jobs", "200").observe(0.01)
    worker = Worker(
        id="host/1",
        hostname="host",
        pid=1,
        gpus=[0],
        concurrency=1,
        started_at=datetime.now(UTC),
        heartbeat_at=datetime.now(UTC),
    )

    kept = RecentJobReads(cast(JobReads, None), max_age_s=0.5)  # counters only: nothing is read
    feed = ChangeFeed(cast(Connect, None), kept)

    class Fixed:
        def collect(self):
            yield from job_families([("job", latest)])
            yield from status_families({"queued": 1, "running": 1})
            yield from worker_families([WorkerState(worker, live=True, running_jobs=["job"])])
            yield from latency.collect()
            yield from PollReadsCollector(kept, feed).collect()

    registry.register(Fixed())
    return {sample.name for family in registry.collect() for sample in family.samples}


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=[path.name for path in DASHBOARDS])
def test_every_dashboard_query_is_valid_promql(dashboard: Path, tmp_path: Path) -> None:
    promtool = _promtool()
    queries = dashboard_queries(dashboard)
    assert queries, f"{dashboard.name} has no queries"
    result = _check_rules(promtool, queries, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(queries)} rules found" in result.stdout, result.stdout


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=[path.name for path in DASHBOARDS])
def test_every_dashboard_query_names_only_exported_metrics(dashboard: Path) -> None:
    exported = exported_names()
    used = {name for query in dashboard_queries(dashboard) for name in re.findall(r"\bhalfcast_\w+", query)}
    assert used and used <= exported, sorted(used - exported)
    assert "halfcast_loss_scale" in used


def test_promtool_rejects_a_broken_query(tmp_path: Path) -> None:
    """The check above can fail: a query with a syntax error is refused."""
    result = _check_rules(_promtool(), ['increase(halfcast_skipped_steps_total{job_id=~".*"}[1m]'], tmp_path)
    assert result.returncode != 0 and "parse error" in (result.stdout + result.stderr).lower()
