"""CLI: seconds from ``POST /jobs`` to the job's first step record, on the whole stack (issue 13 item 3).

``python -m bench.job_start`` starts a stack of its own in a temporary data directory
(SQLite and the filesystem broker, as ``halfcast up`` runs by default): the real API
(:class:`bench.load_stack.ApiProcess`) and one worker (``python -m worker``). It then
submits ``--jobs`` jobs one after another, ``examples/digits-fp32.json`` cut to
``--steps`` steps, and polls ``GET /jobs/{id}`` every ``--poll-s`` seconds: the time
from just before the POST to the first answer with ``step`` >= 1 is the job's start
time; the resource's ``phase`` is noted as it changes, and once the job has succeeded
its ``startup`` times are kept. It prints a markdown table, the median and the median
start-up phases; ``--json`` writes every number. ``--root`` runs the stack from another
source tree (an older commit's ``git archive``) for a before/after on the same machine.

``--modes`` picks what is measured, one after another in one run: ``warm`` (the worker's
warm standby, :mod:`worker.warm`, the default; each job is submitted once a standby is
ready), ``cold`` (``HALFCAST_WARM_START=0``: torchrun and the ranks import torch) and
``bare`` (no service: ``torchrun -m trainer`` of the same spec, timed from its start to
the first step record in its ``records.jsonl``, the floor a cold launch is compared with).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.load_stack import ROOT, ApiProcess, admin_token, process_environment
from halfcast.common.quiet_logs import quiet_third_party_logs

log = logging.getLogger("bench.job_start")

#: The start-up times of the job resource, in phase order.
PHASES = ("launch_s", "imports_s", "data_s", "model_s", "first_step_s")
#: Seconds a job may take from its POST to its end.
JOB_TIMEOUT_S = 600.0
#: Seconds the worker gets to register itself.
WORKER_START_S = 120.0
#: What ``--modes`` may name (see the module).
MODES = ("warm", "cold", "bare")
#: The worker's log line once its warm standby is ready (:mod:`worker.warm.pool`).
STANDBY_READY = b"warm standby"


@dataclass
class JobStart:
    """One job's start: seconds to its first step record, the phases the API showed (with when), its start-up times."""

    job_id: str
    first_step_s: float
    phases_seen: list[tuple[str, float]] = field(default_factory=list)
    startup: dict[str, float | None] | None = None
    status: str = "?"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.job_start", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3, help="jobs submitted one after another (default 3)")
    parser.add_argument("--steps", type=int, default=3, help="max_steps of each job (default 3)")
    parser.add_argument("--poll-s", type=float, default=0.05, help="seconds between two GETs of the job (default 0.05)")
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="source tree the API and worker run from (default: this one)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write every number to this file")
    parser.add_argument(
        "--modes", default="warm,cold,bare", help="comma-separated: warm, cold, bare (default all three)"
    )
    args = parser.parse_args(argv)
    args.modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    if unknown := set(args.modes) - set(MODES):
        parser.error(f"unknown --modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    return args


def job_spec(steps: int, root: Path) -> dict[str, Any]:
    """``examples/digits-fp32.json`` of ``root``, cut to ``steps`` steps (no evaluation before the end)."""
    spec = json.loads((root / "examples" / "digits-fp32.json").read_text())
    spec.update(max_steps=steps, eval_interval=None, name=f"job-start-{steps}-steps")
    return spec


def migrate(database_url: str, root: Path) -> None:
    """``halfcast db upgrade`` of ``root`` on ``database_url`` (its own migrations: an older tree stops at its head)."""
    env = process_environment(database_url, {}, root)
    subprocess.run(
        [sys.executable, "-m", "halfcast.cli", "db", "upgrade"], env=env, cwd=root, check=True, capture_output=True
    )


@contextmanager
def worker_process(
    database_url: str,
    data_dir: Path,
    root: Path,
    warm: bool = True,
    env: Mapping[str, str] | None = None,
    name: str = "worker",
) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m worker`` named ``name`` (its Celery node ``<name>@<host>``, its output in ``<name>.log``) on the
    stack's database and data directory, with ``env`` added (a broker URL, say); stopped on exit."""
    extra = {"HALFCAST_DATA_DIR": str(data_dir), "HALFCAST_WARM_START": "1" if warm else "0", **(env or {})}
    env = process_environment(database_url, extra, root)
    command = [sys.executable, "-m", "worker", "--hostname", f"{name}@%h"]
    with (data_dir / f"{name}.log").open("ab") as out:
        popen = subprocess.Popen(command, env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield popen
    finally:
        popen.terminate()
        try:
            popen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


def wait_for_worker(client: httpx.Client, worker: subprocess.Popen[bytes]) -> None:
    """Return once a worker is registered (``GET /workers``); raise if it exits or takes too long."""
    deadline = time.monotonic() + WORKER_START_S
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited with status {worker.returncode} (see worker.log)")
        if client.get("/workers").json()["workers"]:
            return
        time.sleep(0.2)
    raise RuntimeError(f"no worker registered within {WORKER_START_S:.0f} s")


def measure_job(client: httpx.Client, spec: dict[str, Any], poll_s: float) -> JobStart:
    """Submit ``spec``; poll it to its first step (noting each phase shown), then to its end (keeping ``startup``)."""
    started = time.monotonic()
    job = client.post("/jobs", json=spec).raise_for_status().json()
    seen: list[tuple[str, float]] = []
    first_step_s: float | None = None
    deadline = started + JOB_TIMEOUT_S
    while job["status"] not in ("succeeded", "failed", "cancelled") and time.monotonic() < deadline:
        if first_step_s is None and job.get("step", 0) >= 1:
            first_step_s = time.monotonic() - started
        phase = job.get("phase")
        if phase and (not seen or seen[-1][0] != phase):
            seen.append((phase, round(time.monotonic() - started, 2)))
        time.sleep(poll_s)
        job = client.get(f"/jobs/{job['id']}").raise_for_status().json()
    first_step_s = first_step_s if first_step_s is not None else time.monotonic() - started
    return JobStart(job["id"], round(first_step_s, 2), seen, job.get("startup"), job["status"])


def wait_for_standby(log_path: Path, after: int) -> None:
    """Return once ``worker.log`` has reported a ready warm standby more than ``after`` times (or after a minute)."""
    deadline = time.monotonic() + WORKER_START_S
    while time.monotonic() < deadline:
        ready = [
            line for line in log_path.read_bytes().splitlines() if STANDBY_READY in line and line.endswith(b"is ready")
        ]
        if len(ready) > after:
            return
        time.sleep(0.2)
    log.warning("no warm standby reported ready within %.0f s", WORKER_START_S)


def run_bench(args: argparse.Namespace, warm: bool = True) -> list[JobStart]:
    """Start the stack in a temporary directory and measure ``args.jobs`` jobs, one after another."""
    with tempfile.TemporaryDirectory(prefix="halfcast-job-start-") as tmp:
        data_dir = Path(tmp)
        database_url = f"sqlite:///{data_dir / 'halfcast.db'}"
        migrate(database_url, args.root)
        token = admin_token(database_url)
        with (
            ApiProcess(database_url, data_dir, root=args.root) as api,
            worker_process(database_url, data_dir, args.root, warm) as worker,
            httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client,
        ):
            wait_for_worker(client, worker)
            results = []
            for number in range(1, args.jobs + 1):
                if warm:
                    wait_for_standby(data_dir / "worker.log", number - 1)
                results.append(measure_job(client, job_spec(args.steps, args.root), args.poll_s))
                log.info("job %d/%d: %s", number, args.jobs, results[-1])
            return results


def run_bare(args: argparse.Namespace) -> list[JobStart]:
    """``torchrun -m trainer`` of the same spec, ``args.jobs`` times: seconds from its start to the first step record."""
    results = []
    for number in range(1, args.jobs + 1):
        with tempfile.TemporaryDirectory(prefix="halfcast-bare-") as tmp:
            run_dir = Path(tmp)
            (run_dir / "spec.json").write_text(json.dumps(job_spec(args.steps, args.root)))
            env = process_environment("sqlite://", {}, args.root)
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                       "--nproc-per-node", "1", "-m", "trainer",
                       "--spec", "spec.json", "--run-dir", "."]  # fmt: skip  # each flag beside its value
            started = time.monotonic()
            popen = subprocess.Popen(
                command, cwd=run_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            first = _first_step_time(run_dir / "records.jsonl", popen, started, args.poll_s)
            status = "succeeded" if popen.wait() == 0 else "failed"
            results.append(JobStart(f"bare-{number}", round(first, 2), status=status))
            log.info("bare %d/%d: %s", number, args.jobs, results[-1])
    return results


def _first_step_time(records: Path, popen: subprocess.Popen[bytes], started: float, poll_s: float) -> float:
    while popen.poll() is None and time.monotonic() - started < JOB_TIMEOUT_S:
        if records.exists() and any(_is_step(line) for line in records.read_bytes().splitlines()):
            return time.monotonic() - started
        time.sleep(poll_s)
    return time.monotonic() - started


def _is_step(line: bytes) -> bool:
    try:
        return json.loads(line).get("type") == "step"
    except ValueError:  # a line still being written
        return False


def report(results: list[JobStart]) -> str:
    """A markdown table of the jobs, then the medians of the start time and of each start-up phase."""
    rows = [
        "| job | status | POST → first step record (s) | phases shown (s after POST) | " + " | ".join(PHASES) + " |",
        "|---|---|---|---|" + "---|" * len(PHASES),
    ]
    for index, result in enumerate(results, start=1):
        times = result.startup or {}
        seen = ", ".join(f"{phase} {when}" for phase, when in result.phases_seen) or "-"
        cells = " | ".join(_seconds(times.get(name)) for name in PHASES)
        rows.append(f"| {index} | {result.status} | {result.first_step_s:.2f} | {seen} | {cells} |")
    medians = {name: _median([(r.startup or {}).get(name) for r in results]) for name in PHASES}
    rows.append(
        f"\nmedian POST → first step record: {statistics.median(r.first_step_s for r in results):.2f} s over {len(results)} jobs"
    )
    rows.append("median phases: " + ", ".join(f"{name} {_seconds(value)}" for name, value in medians.items()))
    return "\n".join(rows)


def _median(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; print the report (and write ``--json``); 1 if a job did not succeed."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_third_party_logs()
    measured = {mode: run_bare(args) if mode == "bare" else run_bench(args, warm=mode == "warm") for mode in args.modes}
    for mode, results in measured.items():
        sys.stdout.write(f"\n## {mode}\n\n" + report(results) + "\n")
    if args.json is not None:
        args.json.write_text(
            json.dumps({mode: [asdict(r) for r in results] for mode, results in measured.items()}, indent=2)
        )
    return 0 if all(r.status == "succeeded" for results in measured.values() for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
