"""The event stream on the real stack: every step of a real job arrives once, in order, quickly.

Latency is measured from a step record's ``time`` (the unix time rank 0 stamps on
it when the host issues the step) to the moment this client receives its ``step``
event, with every setting at its default: the trainer's ``log_interval`` (10) and
``log_interval_s`` (0.1 s: 50 ms steps are written every two or three steps), the
worker's tail interval (``HALFCAST_WORKER_POLL_INTERVAL_S``, 0.1 s) and the stream's
poll interval (``HALFCAST_EVENTS_POLL_INTERVAL_S``, 0.1 s). The distribution
is logged and written to ``test-artifacts/event-latency-<layout>.json``.
"""

from __future__ import annotations

import json
import logging
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_support import ROOT, Stack, load_example

pytestmark = pytest.mark.e2e

log = logging.getLogger("e2e")

#: Bound on the 95th percentile of record-to-client latency here, seconds: a few of the stream's poll
#: ticks, so a step held back (a missed wake-up, a batch kept until the job ends) fails on any host.
#: The product's target, p95 under 0.5 s, is a performance target: ``python -m bench.event_latency``
#: checks it on a quiet machine (bench/README.md); this suite runs beside other xdist workers on 2 cores,
#: where the same job measured p95 690 ms (p50 295 ms) with 4 workers.
P95_BOUND_S = 2.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _stream(
    url: str, headers: dict[str, str], received: list[tuple[float, str, str | None, Any]], opened: threading.Event
) -> None:
    """Read the stream until the server closes it, stamping each event with its arrival time."""
    fields: dict[str, str] = {}
    with httpx.Client(timeout=120, headers=headers) as client, client.stream("GET", url) as response:
        response.raise_for_status()
        opened.set()
        for line in response.iter_lines():
            if line == "" and "data" in fields:
                received.append(
                    (time.time(), fields.get("event", "message"), fields.get("id"), json.loads(fields["data"]))
                )
                fields = {}
            elif line and not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value.lstrip(" ")


@pytest.mark.parametrize(
    "layout", ["embedded", pytest.param("services", marks=[pytest.mark.postgres, pytest.mark.redis])]
)
def test_a_real_jobs_steps_stream_once_in_order_and_promptly(layout: str, request: pytest.FixtureRequest) -> None:
    """On SQLite + filesystem broker, and on PostgreSQL + Redis."""
    stack: Stack = request.getfixturevalue(f"{layout}_stack")
    spec = load_example("synthetic-fp16.json", max_steps=120, faults={"sleep_per_step_s": 0.05})
    job = stack.submit(spec)
    received: list[tuple[float, str, str | None, Any]] = []
    opened = threading.Event()
    url = f"{stack.client.base_url}/jobs/{job['id']}/events"
    reader = threading.Thread(target=_stream, args=(url, dict(stack.client.headers), received, opened))
    reader.start()
    assert opened.wait(30)
    reader.join(timeout=300)
    assert not reader.is_alive(), "the stream did not end after the job ended"

    kinds = [kind for _, kind, _, _ in received]
    assert kinds[0] == "status" and kinds[-1] == "status" and received[-1][3]["status"] == "succeeded", received[-1]
    states = [(data["status"], data.get("phase")) for _, kind, _, data in received if kind == "status"]
    assert states == sorted(set(states), key=states.index), states  # each status (and start-up phase) once
    statuses = [status for status, _ in states]
    assert [s for i, s in enumerate(statuses) if s not in statuses[:i]] == [
        "queued",
        "starting",
        "running",
        "succeeded",
    ][-len(set(statuses)) :], statuses  # in order, never back
    assert {phase for status, phase in states if status == "running"} <= {
        None,
        "loading data",
        "building model",
        "first step",
    }
    steps: list[tuple[float, int, Any]] = []
    for arrival, kind, event_id, data in received:
        if kind == "step":
            assert event_id is not None, "a step event's id is its step"
            steps.append((arrival, int(event_id), data))
    assert [step for _, step, _ in steps] == list(range(1, 121))
    assert all(data["step"] == step for _, step, data in steps)
    assert received[-1][3]["eval"] is not None and "eval" in kinds

    latencies = [arrival - data["time"] for arrival, _, data in steps]
    summary = {
        "layout": layout,
        "steps": len(latencies),
        "p50_ms": round(statistics.median(latencies) * 1000, 1),
        "p95_ms": round(_percentile(latencies, 0.95) * 1000, 1),
        "max_ms": round(max(latencies) * 1000, 1),
        "min_ms": round(min(latencies) * 1000, 1),
        "worker_poll_interval_s": float(stack.env["HALFCAST_WORKER_POLL_INTERVAL_S"]),
    }
    log.info("record-to-client latency: %s", summary)
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / f"event-latency-{layout}.json").write_text(json.dumps(summary, indent=2) + "\n")
    assert min(latencies) > -0.05, "a step arrived before rank 0 stamped it: clocks disagree"
    assert summary["p95_ms"] < P95_BOUND_S * 1000, summary


def test_the_cli_submits_a_yaml_spec_and_watches_it_to_the_end(embedded_stack: Stack, tmp_path: Path) -> None:
    """``halfcast submit SPEC.yaml --watch`` as a subprocess (stdout not a TTY: one plain line per step)."""
    spec = load_example("synthetic-fp16.json", max_steps=15, log_interval=5)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    env = {**embedded_stack.env, "HALFCAST_URL": str(embedded_stack.client.base_url)}
    result = subprocess.run(
        [sys.executable, "-m", "halfcast.cli", "submit", str(tmp_path / "spec.yaml"), "--watch"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("submitted job ") and lines[-1].endswith(": succeeded"), result.stdout
    assert sum(line.startswith("[") for line in lines) == 15 and "15/15" in result.stdout
    assert any(line.startswith("eval at step 15: loss ") for line in lines)
