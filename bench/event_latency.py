"""CLI: seconds from a rank-0 step record to the client that follows the job's event stream (issue 17 item 4).

``python -m bench.event_latency`` starts the real stack on a scratch PostgreSQL database
and Redis (the API, :class:`bench.load_stack.ApiProcess`, and one worker), submits
``--jobs`` digits jobs of ``--steps`` steps one after another at the default
``log_interval`` (10) and follows each one's ``GET /jobs/{id}/events`` from before its
first step. For every ``step`` event it notes when it arrived less the record's own
``time`` (when rank 0 issued that step; same host, same clock). Records reach the host
in batches, one per ``log_interval``, so the batch's last step (``step % log_interval == 0``)
measures the path from the trainer's write (plus that one step) through the worker's
tail, the database and the stream's poll to the client; earlier steps of a batch also
waited for the batch. Prints p50/p95/max of both and writes every number with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bench.job_start import job_spec, wait_for_worker, worker_process
from bench.load_stack import ROOT, ApiProcess, admin_token, scratch_database
from halfcast.client import parse_sse
from halfcast.common.quiet_logs import quiet_third_party_logs

log = logging.getLogger("bench.event_latency")

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/11"
#: The trainer's default ``log_interval`` (halfcast/contracts/spec.py): records are flushed every this many steps.
LOG_INTERVAL = 10
#: Seconds one followed job may take.
JOB_TIMEOUT_S = 600.0


@dataclass
class Latencies:
    """Seconds from each step record's ``time`` to its arrival at the client, for one job."""

    job_id: str
    flushed: list[float]
    every: list[float]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.event_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3, help="jobs followed one after another (default 3)")
    parser.add_argument("--steps", type=int, default=400, help="max_steps of each job (default 400)")
    parser.add_argument("--admin-url", default=DEFAULT_ADMIN_URL, help="PostgreSQL server for the scratch database")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL, help="Redis broker (default db 11)")
    parser.add_argument("--json", type=Path, default=None, help="write every number to this file")
    return parser.parse_args(argv)


def follow(client: httpx.Client, job_id: str) -> Latencies:
    """Follow ``job_id``'s event stream to its end; the latency of every step event."""
    flushed: list[float] = []
    every: list[float] = []
    with client.stream("GET", f"/jobs/{job_id}/events", timeout=JOB_TIMEOUT_S) as response:
        response.raise_for_status()
        for event in parse_sse(response.iter_lines()):
            now = time.time()
            if event.event == "step" and event.data.get("time") is not None:
                latency = now - float(event.data["time"])
                every.append(latency)
                if event.data["step"] % LOG_INTERVAL == 0:
                    flushed.append(latency)
            elif event.event == "status" and event.data["status"] in ("succeeded", "failed", "cancelled"):
                break
    return Latencies(job_id, flushed, every)


def percentile(values: list[float], fraction: float) -> float:
    """The ``fraction`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def report(results: list[Latencies]) -> str:
    """A markdown table: p50, p95 and max of the flushed steps' and of every step's latency, in milliseconds."""
    rows = ["| steps measured | n | p50 (ms) | p95 (ms) | max (ms) |", "|---|---|---|---|---|"]
    for name, values in (
        ("last of each batch (the flush)", [v for r in results for v in r.flushed]),
        ("every step", [v for r in results for v in r.every]),
    ):
        if values:
            cells = " | ".join(
                f"{1000 * x:.0f}" for x in (statistics.median(values), percentile(values, 0.95), max(values))
            )
            rows.append(f"| {name} | {len(values)} | {cells} |")
    return "\n".join(rows)


def run_bench(args: argparse.Namespace) -> list[Latencies]:
    """Start the stack; submit and follow ``args.jobs`` jobs one after another."""
    with tempfile.TemporaryDirectory(prefix="halfcast-events-") as tmp, scratch_database(args.admin_url) as db_url:
        data_dir = Path(tmp)
        token = admin_token(db_url)
        env = {"HALFCAST_BROKER_URL": args.redis_url}
        with (
            ApiProcess(db_url, data_dir, env=env) as api,
            worker_process(db_url, data_dir, ROOT, env=env) as popen,
            httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client,
        ):
            wait_for_worker(client, popen)
            results = []
            for number in range(1, args.jobs + 1):
                spec = {**job_spec(args.steps, ROOT), "log_interval": LOG_INTERVAL}
                job = client.post("/jobs", json=spec).raise_for_status().json()
                results.append(follow(client, job["id"]))
                log.info("job %d/%d: %d step events", number, args.jobs, len(results[-1].every))
            return results


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench and print the table (and write ``--json``)."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_third_party_logs()
    results = run_bench(args)
    sys.stdout.write(report(results) + "\n")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(result) for result in results], indent=2))
    return 0 if all(result.every for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
