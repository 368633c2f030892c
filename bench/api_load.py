"""CLI: latency and throughput of ``GET /jobs/{id}`` under many concurrent pollers, on PostgreSQL (issue 11).

``python -m bench.api_load --clients 20,200 --json out.json`` creates a scratch
database, starts the real API (``halfcast api``, :mod:`bench.load_stack`), submits
``--jobs`` jobs through it and has ``--running`` of them written to as a worker
would (:mod:`bench.load_writer`: a step record every 50-100 ms each), then, for
every client count and mode, runs that many pollers for ``--duration`` seconds
(:mod:`bench.load_clients`; ``plain`` or ``conditional``, with ``If-None-Match``) while
a probe submits and cancels a job and asks ``/healthz`` once a second. It writes a
markdown table to stdout and, with ``--json``, every number to a file; it stops by
itself (each request gives up after ``--timeout``) and drops the database.
``--api-root`` runs the API from another source tree, e.g. an older commit's
``git archive``, for a before/after on the same bench.

``--training N`` (issue 31) measures the same scenarios a second time against a fresh stack
where a real worker (:mod:`bench.load_training`) trains ``N`` fp16 digits jobs on this host,
and the pollers poll those jobs: the API beside training that takes every core. A quiet window
of the same length (no pollers) before and after each such scenario measures the jobs' training
rate, so each row says what the pollers cost the training (``train steps/s``, the quiet windows'
mean then the polled window's) and what CPU the runs had (``run cores``); a second table splits
the host's CPU by role (:mod:`bench.cpu_roles`: API, worker, runs, PostgreSQL, load generator).
``--worker-env HALFCAST_RUN_NICE=0`` runs the training at the API's priority, for a before/after.
Both sets of rows are in the one table (``load``: simulated writers, or the training jobs).
``own reads`` is the share of the polls that made a database read of their own, from the API's
``halfcast_poll_reads_total`` (:mod:`bench.poll_reads`; ``all`` when polls keep no reads).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import httpx

from bench.cpu_roles import Reading, Role, RoleMap, cpu_by_pid
from bench.load_clients import PollPlan, Tally, poll_share, probe, summary
from bench.load_stack import ROOT, ApiProcess, admin_token, scratch_database
from bench.load_training import (
    StepMark,
    TrainingWindow,
    WorkerProcess,
    cancel_jobs,
    mark_steps,
    quiet_window,
    training_spec,
)
from bench.load_writer import Writer, WriterConfig
from bench.poll_reads import own_read_share, poll_read_counts
from halfcast.common.quiet_logs import quiet_third_party_logs

log = logging.getLogger(__name__)

DEFAULT_ADMIN_URL = os.environ.get("HALFCAST_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
MODES = ("plain", "conditional")
#: Seconds to wait between two scenarios (the API drains what the last one left).
PAUSE_S = 2.0
COLUMNS = (
    "load",
    "clients",
    "mode",
    "think s",
    "answers/s",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "max ms",
    "304 share",
    "errors",
    "cancel p50/max ms",
    "healthz max ms",
    "API CPU ms/req",
    "own reads",
    "client CPU ms/req",
    "load 1m",
    "train steps/s quiet/polled",
    "run cores quiet/polled",
)
#: How long the training jobs get to start (torch imported, first step recorded).
TRAINING_START_S = 300.0


@dataclass(frozen=True)
class Scenario:
    """One measured run: how many pollers, with or without ``If-None-Match``, and their pause between requests."""

    clients: int
    mode: str
    think_s: float


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The CLI's options (see ``--help``)."""
    parser = argparse.ArgumentParser(prog="python -m bench.api_load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="20,200", help="comma-separated poller counts, one scenario each")
    parser.add_argument("--modes", default="plain,conditional", help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--think", type=float, default=0.0, help="seconds each poller waits between requests (0: none)")
    parser.add_argument("--duration", type=float, default=15.0, help="measured seconds per scenario")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds at the start of each scenario")
    parser.add_argument("--jobs", type=int, default=8, help="jobs submitted")
    parser.add_argument("--running", type=int, default=4, help="of which this many get step records written (polled)")
    parser.add_argument(
        "--step-interval", default="0.05,0.1", help="seconds between two step records of a job: MIN,MAX"
    )
    parser.add_argument("--procs", type=int, default=1, help="load-generator processes the pollers are spread over")
    parser.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="pollers' HTTP client: raw (bench.load_http, ~0.1 ms CPU/request) or httpx (~1.7 ms)",
    )
    parser.add_argument("--api-workers", type=int, default=1, help="API processes (halfcast api --workers)")
    parser.add_argument("--api-env", action="append", default=[], metavar="NAME=VALUE", help="extra API setting")
    parser.add_argument(
        "--training", type=int, default=0, help="also measure beside this many real CPU training jobs (0: not)"
    )
    parser.add_argument(
        "--worker-env", action="append", default=[], metavar="NAME=VALUE", help="extra worker setting (--training)"
    )
    parser.add_argument(
        "--api-root",
        type=Path,
        default=ROOT,
        help="source tree the API runs from (e.g. `git archive` of an older commit, for a before/after)",
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="client timeout per request, seconds")
    parser.add_argument("--probe-interval", type=float, default=1.0, help="seconds between two probes")
    parser.add_argument(
        "--admin-url", default=DEFAULT_ADMIN_URL, help="PostgreSQL URL to create the scratch database from"
    )
    parser.add_argument("--json", type=Path, help="write the full result here")
    return parser.parse_args(argv)


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    """Every (client count, mode) pair of the options, in order."""
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = set(modes) - set(MODES)
    if unknown:
        raise SystemExit(f"unknown mode(s): {', '.join(sorted(unknown))}")
    counts = [int(count) for count in args.clients.split(",") if count.strip()]
    return [Scenario(clients, mode, args.think) for clients in counts for mode in modes]


def bench_spec() -> dict[str, Any]:
    """The spec every bench job is submitted with (the fp16 digits example)."""
    spec: dict[str, Any] = json.loads((ROOT / "examples" / "digits-fp16.json").read_text())
    return spec


def submit_jobs(url: str, token: str, count: int, spec: dict[str, Any] | None = None) -> list[str]:
    """Submit ``count`` jobs of ``spec`` (default :func:`bench_spec`); their ids."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        ids = []
        for _ in range(count):
            response = client.post("/jobs", json=spec or bench_spec())
            response.raise_for_status()
            ids.append(response.json()["id"])
        return ids


def wait_running(url: str, token: str, job_ids: Sequence[str], timeout_s: float = 60.0) -> None:
    """Wait until every job of ``job_ids`` is ``running`` with a step record."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10) as client:
        while time.monotonic() < deadline:
            jobs = [client.get(f"/jobs/{job_id}").json() for job_id in job_ids]
            if all(job["status"] == "running" and job["step"] > 0 for job in jobs):
                return
            time.sleep(0.2)
    raise RuntimeError(f"the jobs did not start running within {timeout_s:.0f} s")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and of its children that are alive (Linux ``/proc``)."""
    reading = cpu_by_pid()
    return sum(cpu for child, cpu in reading.cpu_s.items() if child == pid or reading.parent.get(child) == pid)


def _plans(
    args: argparse.Namespace, scenario: Scenario, url: str, token: str, targets: Sequence[str]
) -> list[PollPlan]:
    """The pollers of ``scenario`` split over ``--procs`` processes; poller ``i`` polls ``targets[i % len]``."""
    jobs = [targets[i % len(targets)] for i in range(scenario.clients)]
    procs = max(1, min(args.procs, scenario.clients))
    return [
        PollPlan(
            url=url,
            token=token,
            job_ids=jobs[p::procs],
            duration_s=args.duration,
            warmup_s=args.warmup,
            think_s=scenario.think_s,
            conditional=scenario.mode == "conditional",
            timeout_s=args.timeout,
            client=args.client,
        )
        for p in range(procs)
    ]


async def _measure(
    pool: ProcessPoolExecutor, plans: list[PollPlan], args: argparse.Namespace, url: str, token: str
) -> tuple[Tally, dict[str, Tally], float]:
    loop = asyncio.get_running_loop()
    shares = [loop.run_in_executor(pool, poll_share, plan) for plan in plans]
    await asyncio.sleep(args.warmup)
    probes = probe(url, token, bench_spec(), args.duration, args.probe_interval, args.timeout)
    results, probed = await asyncio.gather(asyncio.gather(*shares), probes)
    tally = Tally()
    for share in results:
        tally.merge(Tally(share["latencies"], Counter(share["outcomes"])))
    return tally, probed, sum(share["cpu_s"] for share in results)


def run_scenario(
    pool: ProcessPoolExecutor,
    args: argparse.Namespace,
    scenario: Scenario,
    api: ApiProcess,
    token: str,
    targets: Sequence[str],
) -> dict[str, Any]:
    """Measure one scenario; its summary, the probe's and the API's CPU time per request."""
    log.info("scenario: %d clients, %s, think %.2f s", scenario.clients, scenario.mode, scenario.think_s)
    assert api.popen is not None
    cpu_before, load_before = cpu_seconds(api.popen.pid), os.getloadavg()[0]
    reads_before = poll_read_counts(api.url, token)
    tally, probed, client_cpu = asyncio.run(
        _measure(pool, _plans(args, scenario, api.url, token, targets), args, api.url, token)
    )
    cpu = cpu_seconds(api.popen.pid) - cpu_before
    own_reads = own_read_share(reads_before, poll_read_counts(api.url, token))
    result: dict[str, Any] = {
        "load": "simulated",
        "scenario": asdict(scenario),
        "polls": summary(tally, args.duration),
        "probe": {name: summary(t, args.duration) for name, t in probed.items()},
    }
    result["api_cpu_s"] = cpu
    result["own_read_share"] = own_reads  # None: polls keep no reads (each reads the database)
    result["load_avg_1m"] = [load_before, os.getloadavg()[0]]  # the machine's, before and after: others share it
    result["api_cpu_ms_per_request"] = cpu * 1e3 / max(1, result["polls"]["requests"])
    result["client_cpu_ms_per_request"] = client_cpu * 1e3 / max(1, result["polls"]["requests"])  # warm-up included
    return result


def _simulated_phase(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    """Every scenario against jobs whose step records a simulated writer writes; results, writer stats, API log."""
    low, high = (float(value) for value in args.step_interval.split(","))
    extra = dict(item.split("=", 1) for item in args.api_env)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="halfcast-load-") as tmp, scratch_database(args.admin_url) as db_url:
        token = admin_token(db_url)
        with ApiProcess(db_url, Path(tmp) / "data", workers=args.api_workers, env=extra, root=args.api_root) as api:
            job_ids = submit_jobs(api.url, token, args.jobs)
            targets = job_ids[: args.running]
            writer_config = WriterConfig(db_url, targets, Path(tmp) / "runs", (low, high))
            with (
                Writer(writer_config) as writer,
                ProcessPoolExecutor(args.procs, mp_context=get_context("spawn")) as pool,
            ):
                wait_running(api.url, token, targets)
                started = time.monotonic()
                for scenario in scenarios(args):
                    results.append(run_scenario(pool, args, scenario, api, token, targets))
                    time.sleep(PAUSE_S)
                elapsed = time.monotonic() - started
            api_log = api.log_tail(20)
    steps = sum(writer.steps.values())
    return results, {"steps": writer.steps, "steps_per_s": steps / elapsed if elapsed else 0.0}, api_log


@dataclass
class _PolledMark:
    """The jobs' steps and the host's CPU once the scenario's warm-up is over."""

    steps: StepMark | None = None
    reading: Reading | None = None


def _training_scenario(
    pool: ProcessPoolExecutor,
    args: argparse.Namespace,
    scenario: Scenario,
    api: ApiProcess,
    token: str,
    job_ids: Sequence[str],
    roles: RoleMap,
) -> dict[str, Any]:
    """The scenario polling the training jobs between two quiet windows (the jobs' rate with no poller).

    The polled window is the pollers' measured one (from the end of their warm-up); the quiet
    rate is the mean of the windows before and after it, so a drift of the training rate over
    the scenario is not counted as the pollers' price. The host's CPU by role is read over the
    first quiet window and over the polled one.
    """
    reading = cpu_by_pid()
    quiet = quiet_window(api.url, token, job_ids, args.duration)
    quiet_cores = roles.split(reading, cpu_by_pid())
    mark = _PolledMark()

    def take_mark() -> None:
        mark.steps, mark.reading = mark_steps(api.url, token, job_ids), cpu_by_pid()

    timer = threading.Timer(args.warmup, take_mark)
    timer.start()
    result = run_scenario(pool, args, scenario, api, token, job_ids)
    timer.join()
    assert mark.steps is not None and mark.reading is not None
    polled = TrainingWindow.between(mark.steps, mark_steps(api.url, token, job_ids))
    polled_cores = roles.split(mark.reading, cpu_by_pid())
    quiet_after = quiet_window(api.url, token, job_ids, args.duration)
    result["load"] = f"{len(job_ids)} training job" + ("s" if len(job_ids) > 1 else "")
    result["training"] = {"quiet": asdict(quiet), "polled": asdict(polled), "quiet_after": asdict(quiet_after)}
    result["training_steps_per_s"] = {
        "quiet": (quiet.steps_per_s + quiet_after.steps_per_s) / 2,
        "polled": polled.steps_per_s,
    }
    result["cpu_cores_by_role"] = {"quiet": quiet_cores, "polled": polled_cores}
    return result


def _warm_pool(pool: ProcessPoolExecutor, procs: int) -> None:
    """Start the poller processes (and their imports) now, so that no measured window pays for it."""
    for future in [pool.submit(time.sleep, 0.2) for _ in range(procs)]:
        future.result()


def _training_phase(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str]:
    """Every scenario against ``--training`` real jobs that a worker on this host trains; results, worker log."""
    api_env = dict(item.split("=", 1) for item in args.api_env)
    worker_env = dict(item.split("=", 1) for item in args.worker_env)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="halfcast-load-") as tmp, scratch_database(args.admin_url) as db_url:
        token, data_dir = admin_token(db_url), Path(tmp) / "data"
        with (
            ApiProcess(db_url, data_dir, workers=args.api_workers, env=api_env, root=args.api_root) as api,
            WorkerProcess(db_url, data_dir, concurrency=args.training, env=worker_env, root=args.api_root) as worker,
            ProcessPoolExecutor(args.procs, mp_context=get_context("spawn")) as pool,
        ):
            job_ids = submit_jobs(api.url, token, args.training, training_spec())
            try:
                wait_running(api.url, token, job_ids, TRAINING_START_S)
                roles = RoleMap(api=_pid(api.popen), worker=_pid(worker.popen))
                _warm_pool(pool, args.procs)
                for scenario in scenarios(args):
                    results.append(_training_scenario(pool, args, scenario, api, token, job_ids, roles))
            finally:
                cancel_jobs(api.url, token, job_ids)
            worker_log = worker.log_tail(20)
    return results, worker_log


def _pid(popen: subprocess.Popen[bytes] | None) -> int:
    if popen is None:
        raise RuntimeError("the process is not running")
    return popen.pid


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Set each stack up, run every scenario, tear it down; the result (see the module docstring)."""
    results, writer, api_log = _simulated_phase(args)
    out: dict[str, Any] = {
        "settings": {key: str(value) for key, value in vars(args).items()},
        "results": results,
        "writer": writer,
        "api_log_tail": api_log,
    }
    if args.training > 0:
        training_results, out["worker_log_tail"] = _training_phase(args)
        results.extend(training_results)
    out["machine"] = {"logical_cpus": os.cpu_count(), "load_avg": os.getloadavg()}
    return out


def _row(result: dict[str, Any]) -> list[str]:
    polls, probed, scenario = result["polls"], result["probe"], result["scenario"]
    share = polls["outcomes"].get("not_modified", 0) / max(1, polls["requests"])
    errors = ", ".join(f"{name} {count}" for name, count in sorted(polls["errors"].items())) or "0"
    cancel = probed["cancel"]
    cancel_errors = sum(probed["cancel"]["errors"].values()) + sum(probed["submit"]["errors"].values())
    cancel_text = f"{cancel['p50_ms']:.0f}/{cancel['max_ms']:.0f}" + (
        f" ({cancel_errors} err)" if cancel_errors else ""
    )
    rates = result.get("training_steps_per_s")
    training = f"{rates['quiet']:.1f}/{rates['polled']:.1f}" if rates else "-"
    cores = result.get("cpu_cores_by_role")
    run_cores = f"{cores['quiet'][Role.RUNS]:.2f}/{cores['polled'][Role.RUNS]:.2f}" if cores else "-"
    return [
        result.get("load", "simulated"),
        str(scenario["clients"]),
        scenario["mode"],
        f"{scenario['think_s']:g}",
        f"{polls['answers_per_s']:.0f}",
        f"{polls['p50_ms']:.1f}",
        f"{polls['p95_ms']:.1f}",
        f"{polls['p99_ms']:.1f}",
        f"{polls['max_ms']:.0f}",
        f"{share:.0%}",
        errors,
        cancel_text,
        f"{probed['healthz']['max_ms']:.0f}",
        f"{result['api_cpu_ms_per_request']:.2f}",
        "all" if result.get("own_read_share") is None else f"{result['own_read_share']:.1%}",
        f"{result['client_cpu_ms_per_request']:.2f}",
        "{:.1f}-{:.1f}".format(*result["load_avg_1m"]),
        training,
        run_cores,
    ]


def markdown_table(results: Sequence[dict[str, Any]]) -> str:
    """One row per scenario, as a markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_row(result)) + " |" for result in results]
    return "\n".join(lines) + "\n"


def cores_table(results: Sequence[dict[str, Any]]) -> str:
    """The host's cores by role in each training scenario's quiet and polled windows, as a markdown table."""
    rows = [result for result in results if "cpu_cores_by_role" in result]
    if not rows:
        return ""
    header = ["clients", "window", *[role.value for role in Role], "total"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for result in rows:
        for window, cores in result["cpu_cores_by_role"].items():
            values = [cores[role] for role in Role]
            cells = [str(result["scenario"]["clients"]), window, *[f"{v:.2f}" for v in values], f"{sum(values):.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\ncores by role (CPU seconds per second):\n\n" + "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; the table goes to stdout, progress to the log."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_third_party_logs()
    args = parse_args(argv)
    result = run_bench(args)
    result["command"] = "python -m bench.api_load " + " ".join(sys.argv[1:] if argv is None else argv)
    writer = result["writer"]
    sys.stdout.write(markdown_table(result["results"]))
    sys.stdout.write(cores_table(result["results"]))
    sys.stdout.write(f"\nwriter: {writer['steps_per_s']:.1f} step records/s over {len(writer['steps'])} running jobs\n")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
