"""Cancel latency: seconds from ``POST /jobs/{id}/cancel`` to ``GET /jobs/{id}`` showing ``cancelled``.

Issue 13: a cancel (likewise a deadline, a worker shutdown) must end as soon as every
rank has written its stop checkpoint and exited, not after ``HALFCAST_CANCEL_GRACE_S``.
This bench runs the real stack, ``halfcast up`` (the API and one worker), in a scratch
data directory: embedded SQLite and filesystem broker by default; with ``--admin-url``
a scratch database of its own on that PostgreSQL server (created, migrated, dropped
afterwards: :func:`bench.load_stack.scratch_database`), with ``--broker-url`` that
broker (a queue of its own). For each of ``--repeats`` rounds it submits a CPU job (the
``synthetic-fp16`` example, ``--processes`` ranks, ``--sleep-per-step`` seconds per
step, so it never ends by itself), waits until it is running at step 2, cancels it
and polls until it is ``cancelled``.

Per round it reports the latency, the final status and reason, and what the run left
in ``logs/launcher.log``: whether torchrun printed a ``SignalException`` traceback,
and whether the worker had to SIGKILL (its log says "outlived its ... grace period").

::

    .venv/bin/python -m bench.cancel_latency --repeats 5 --processes 2 --grace 10
    .venv/bin/python -m bench.cancel_latency --repeats 3 --admin-url postgresql+psycopg://postgres@127.0.0.1:5432/test \\
        --broker-url redis://127.0.0.1:6379/0 --json cancel.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.load_stack import free_port, scratch_database

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "synthetic-fp16.json"
#: Seconds the stack gets to answer ``/readyz`` and write its admin token.
START_TIMEOUT_S = 120.0
#: Seconds a job gets to reach its second step, and a cancel to end it.
JOB_TIMEOUT_S = 180.0
#: Seconds ``halfcast up`` gets to stop after SIGTERM before it is killed.
STOP_TIMEOUT_S = 120.0
#: Interval between polls of the job resource while the cancel is timed.
POLL_S = 0.02
#: What the worker logs when a run outlived its grace period and is SIGKILLed
#: (:meth:`worker.launch.process_tree.RunProcess.stop`).
KILLED_MARK = "grace period; killing it"


@dataclass(frozen=True)
class Round:
    """One cancel: its latency and what the run left behind."""

    job_id: str
    seconds: float
    status: str
    reason: str | None
    signal_traceback: bool
    sigkilled: bool


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m bench.cancel_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="cancels to time (default 3)")
    parser.add_argument("--processes", type=int, default=2, help="ranks per job (default 2)")
    parser.add_argument("--grace", type=float, default=10.0, help="HALFCAST_CANCEL_GRACE_S (default 10)")
    parser.add_argument(
        "--sleep-per-step", type=float, default=0.2, help="the job's faults.sleep_per_step_s (default 0.2)"
    )
    parser.add_argument(
        "--admin-url", help="PostgreSQL admin URL: run on a scratch database there (default: embedded SQLite)"
    )
    parser.add_argument("--broker-url", help="HALFCAST_BROKER_URL (default: embedded filesystem broker)")
    parser.add_argument("--data-dir", type=Path, help="data directory (default: a new temporary one, kept)")
    parser.add_argument("--json", type=Path, help="also write the rounds and the summary to this file")
    return parser.parse_args(argv)


def stack_environment(args: argparse.Namespace, data_dir: Path, database_url: str | None) -> dict[str, str]:
    """This process's environment without ``HALFCAST_*``, plus the bench's settings."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HALFCAST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    env["HALFCAST_DATA_DIR"] = str(data_dir)
    env["HALFCAST_ALLOW_FAULTS"] = "1"
    env["HALFCAST_WORKER_POLL_INTERVAL_S"] = "0.1"
    env["HALFCAST_CANCEL_GRACE_S"] = str(args.grace)
    env["HALFCAST_QUEUE_NAME"] = f"bench-cancel-{uuid.uuid4().hex[:8]}"
    if database_url:
        env["HALFCAST_DATABASE_URL"] = database_url
    if args.broker_url:
        env["HALFCAST_BROKER_URL"] = args.broker_url
    return env


@contextmanager
def running_stack(env: dict[str, str], data_dir: Path) -> Iterator[httpx.Client]:
    """``halfcast up`` on a free port; yields an authenticated client; SIGTERM (then SIGKILL) on exit."""
    port = free_port()
    command = [sys.executable, "-m", "halfcast.cli", "up", "--port", str(port), "--data-dir", str(data_dir)]
    data_dir.mkdir(parents=True, exist_ok=True)
    with (data_dir / "up.log").open("ab") as out:
        up = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    try:
        _wait_ready(up, client, data_dir)
        yield client
    finally:
        client.close()
        _stop(up)


def _wait_ready(up: subprocess.Popen[bytes], client: httpx.Client, data_dir: Path) -> None:
    """Wait until the API is ready and the admin token is written; authenticate ``client`` with it."""
    deadline = time.monotonic() + START_TIMEOUT_S
    token = data_dir / "token"
    while time.monotonic() < deadline:
        if up.poll() is not None:
            raise RuntimeError(f"halfcast up exited with {up.returncode}: see {data_dir / 'up.log'}")
        try:
            if token.exists() and client.get("/readyz").status_code == 200:
                client.headers["Authorization"] = f"Bearer {token.read_text().strip()}"
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the stack did not start within {START_TIMEOUT_S:.0f} s: see {data_dir / 'up.log'}")


def _stop(up: subprocess.Popen[bytes]) -> None:
    if up.poll() is not None:
        return
    up.send_signal(signal.SIGTERM)
    try:
        up.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log.warning("halfcast up did not stop within %.0f s; killing it", STOP_TIMEOUT_S)
        up.kill()
        up.wait()


def job_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The synthetic-fp16 example, long enough never to end by itself."""
    spec = json.loads(EXAMPLE.read_text())
    spec.update(processes=args.processes, max_steps=1_000_000, faults={"sleep_per_step_s": args.sleep_per_step})
    return spec


def wait_job(
    client: httpx.Client, job_id: str, done: Callable[[dict[str, Any]], bool], timeout_s: float = JOB_TIMEOUT_S
) -> dict[str, Any]:
    """Poll the job every :data:`POLL_S` until ``done(job)``; raise ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not done(job := client.get(f"/jobs/{job_id}").raise_for_status().json()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} stuck at {job['status']}")
        time.sleep(POLL_S)
    return job


def time_cancel(client: httpx.Client, args: argparse.Namespace, data_dir: Path) -> Round:
    """Submit a job, wait for step 2, cancel it and time until it is terminal."""
    job_id = client.post("/jobs", json=job_spec(args)).raise_for_status().json()["id"]
    wait_job(client, job_id, lambda job: job["status"] == "running" and job["step"] >= 2)
    kills_before = _kills(data_dir)
    started = time.monotonic()
    client.post(f"/jobs/{job_id}/cancel").raise_for_status()
    job = wait_job(client, job_id, lambda job: job["status"] in ("succeeded", "failed", "cancelled"))
    seconds = time.monotonic() - started
    launcher = "".join(
        path.read_text(errors="replace") for path in (data_dir / "runs" / job_id).glob("attempt-*/logs/launcher.log")
    )
    reason = (job.get("error") or {}).get("reason")
    return Round(job_id, seconds, job["status"], reason, "SignalException" in launcher, _kills(data_dir) > kills_before)


def _kills(data_dir: Path) -> int:
    """How often the worker's log (in ``up.log``) says it SIGKILLed a run (one round at a time runs)."""
    return (data_dir / "up.log").read_text(errors="replace").count(KILLED_MARK)


def summary(rounds: Sequence[Round]) -> dict[str, Any]:
    """Median, min and max latency; how many rounds were cancelled, left a traceback, or were SIGKILLed."""
    seconds = [r.seconds for r in rounds]
    return {
        "rounds": len(rounds),
        "median_s": statistics.median(seconds),
        "min_s": min(seconds),
        "max_s": max(seconds),
        "cancelled": sum(r.status == "cancelled" for r in rounds),
        "signal_tracebacks": sum(r.signal_traceback for r in rounds),
        "sigkilled": sum(r.sigkilled for r in rounds),
    }


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Start the stack, time ``args.repeats`` cancels, stop the stack; the rounds and their summary."""
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="halfcast-cancel-bench-"))
    log.info("data directory %s", data_dir)
    rounds: list[Round] = []
    with (
        _database(args.admin_url) as database_url,
        running_stack(stack_environment(args, data_dir, database_url), data_dir) as client,
    ):
        for n in range(args.repeats):
            rounds.append(time_cancel(client, args, data_dir))
            log.info("round %d: %.2f s, %s", n + 1, rounds[-1].seconds, rounds[-1].status)
    settings = {
        "processes": args.processes,
        "grace_s": args.grace,
        "sleep_per_step_s": args.sleep_per_step,
        "database": "scratch PostgreSQL" if args.admin_url else "embedded",
        "broker": args.broker_url or "embedded",
    }
    return {
        "settings": settings,
        "rounds": [asdict(r) for r in rounds],
        "summary": summary(rounds),
        "data_dir": str(data_dir),
    }


@contextmanager
def _database(admin_url: str | None) -> Iterator[str | None]:
    """A scratch PostgreSQL database's URL on the server of ``admin_url``; ``None`` (embedded SQLite) without one."""
    if admin_url is None:
        yield None
        return
    with scratch_database(admin_url) as url:
        yield url


def report(result: dict[str, Any]) -> str:
    """One line per round, then the summary line."""
    lines = [
        f"{r['job_id']}  {r['seconds']:6.2f} s  {r['status']:<9} reason={r['reason']}  "
        f"SignalException={r['signal_traceback']}  SIGKILL={r['sigkilled']}"
        for r in result["rounds"]
    ]
    s = result["summary"]
    lines.append(
        f"cancel -> cancelled, {s['rounds']} rounds {result['settings']}: median {s['median_s']:.2f} s, "
        f"min {s['min_s']:.2f} s, max {s['max_s']:.2f} s; tracebacks {s['signal_tracebacks']}, SIGKILLs {s['sigkilled']}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; print the report; 1 if a round did not end ``cancelled``."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    result = run_bench(args)
    print(report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    summary_ = result["summary"]
    return 0 if summary_["cancelled"] == summary_["rounds"] else 1


if __name__ == "__main__":
    sys.exit(main())
