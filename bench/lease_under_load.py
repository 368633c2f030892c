"""Leases and heartbeats while training takes every core (issue 31, item 3): no lease lost, no worker lost.

A worker (:class:`bench.load_training.WorkerProcess`, at its default run priority) trains ``--jobs``
fp16 digits jobs on this host for ``--duration`` seconds, beside an API, on a scratch PostgreSQL
database. Every ``--interval`` seconds the bench reads from the database what the control plane
keeps fresh: each running job's lease (``lease_expires_at`` minus now: how long it had left) and
the worker's heartbeat (now minus ``heartbeat_at``). The report says how close each came to its
deadline (the smallest lease margin against ``HALFCAST_LEASE_TTL_S``, the oldest heartbeat against
``HALFCAST_WORKER_LIVE_S``), which attempts ended ``worker_lost``, the worker's "lost its lease"
lines, and whether every job was still running at the end. It passes when no deadline was missed::

    python -m bench.lease_under_load --jobs 2 --duration 300 --json /tmp/lease.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from bench.api_load import DEFAULT_ADMIN_URL, submit_jobs, wait_running
from bench.load_stack import ApiProcess, admin_token, scratch_database
from bench.load_training import TrainingWindow, WorkerProcess, cancel_jobs, mark_steps, training_spec
from halfcast.core.db.engine import make_engine, make_session_factory
from halfcast.core.db.models import Attempt, Job, Worker, utcnow
from halfcast.core.settings import Settings

log = logging.getLogger("bench.lease_under_load")

#: Seconds the jobs get to start (torch imported, first step recorded).
START_TIMEOUT_S = 120.0
#: What the worker logs when an attempt loses its lease (``worker/lifecycle/lease.py``).
LEASE_LOST_LINE = "lost its lease"


@dataclass
class Deadlines:
    """The closest the leases and the heartbeat came to their deadlines over the samples taken so far."""

    lease_ttl_s: float
    worker_live_s: float
    samples: int = 0
    min_lease_margin_s: float | None = None
    max_heartbeat_age_s: float | None = None

    def add(self, lease_margins: Sequence[float], heartbeat_age_s: float | None) -> None:
        """One sample: the running jobs' lease margins and the worker's heartbeat age (None: no row)."""
        self.samples += 1
        for margin in lease_margins:
            self.min_lease_margin_s = (
                margin if self.min_lease_margin_s is None else min(self.min_lease_margin_s, margin)
            )
        if heartbeat_age_s is not None:
            self.max_heartbeat_age_s = max(self.max_heartbeat_age_s or 0.0, heartbeat_age_s)

    def missed(self) -> list[str]:
        """The deadlines missed (a lease that expired, a heartbeat older than the live window, or no sample)."""
        problems = []
        if self.min_lease_margin_s is None or self.max_heartbeat_age_s is None:
            problems.append("no lease or no heartbeat was ever seen")
        if self.min_lease_margin_s is not None and self.min_lease_margin_s <= 0.0:
            problems.append(f"a lease expired ({self.min_lease_margin_s:.2f} s left)")
        if self.max_heartbeat_age_s is not None and self.max_heartbeat_age_s >= self.worker_live_s:
            problems.append(
                f"the heartbeat was {self.max_heartbeat_age_s:.2f} s old (live: {self.worker_live_s:.0f} s)"
            )
        return problems


@dataclass
class LeaseReport:
    """What a run found: the deadlines, the attempts lost, the log lines, the jobs' state and training rate."""

    jobs: int
    duration_s: float
    deadlines: Deadlines
    worker_lost_attempts: int = 0
    lease_lost_lines: list[str] = field(default_factory=list)
    jobs_running_at_end: int = 0
    steps_per_s: float = 0.0

    @property
    def problems(self) -> list[str]:
        """Every reason the run failed; empty when it passed."""
        problems = self.deadlines.missed()
        if self.worker_lost_attempts:
            problems.append(f"{self.worker_lost_attempts} attempt(s) ended worker_lost")
        if self.lease_lost_lines:
            problems.append(f"the worker lost {len(self.lease_lost_lines)} lease(s)")
        if self.jobs_running_at_end < self.jobs:
            problems.append(f"{self.jobs - self.jobs_running_at_end} job(s) stopped running")
        return problems

    def as_dict(self) -> dict[str, object]:
        """The report as JSON-ready data, its verdict included."""
        return {**asdict(self), "problems": self.problems, "ok": not self.problems}


def sample(sessions: sessionmaker[Session]) -> tuple[list[float], float | None]:
    """The running jobs' lease margins (seconds) and the newest worker heartbeat's age, as of now."""
    with sessions() as session:
        now = utcnow()
        leases = session.scalars(select(Job.lease_expires_at).where(Job.status == "running")).all()
        heartbeat = session.scalar(select(func.max(Worker.heartbeat_at)))
    margins = [(expires - now).total_seconds() for expires in leases if expires is not None]
    return margins, (now - heartbeat).total_seconds() if heartbeat is not None else None


def worker_lost_attempts(sessions: sessionmaker[Session]) -> int:
    """Attempts that ended ``worker_lost`` (a lease expired and a reaper recovered the job)."""
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(Attempt).where(Attempt.reason == "worker_lost")) or 0


def watch(sessions: sessionmaker[Session], deadlines: Deadlines, duration_s: float, interval_s: float) -> None:
    """Sample the leases and the heartbeat every ``interval_s`` for ``duration_s``."""
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        deadlines.add(*sample(sessions))
        time.sleep(interval_s)


def run_bench(args: argparse.Namespace) -> LeaseReport:
    """Start the stack, train, watch, stop; the report."""
    defaults = Settings.model_fields  # what the worker runs with: its environment has no HALFCAST_* but the database's
    deadlines = Deadlines(defaults["lease_ttl_s"].default, defaults["worker_live_s"].default)
    report = LeaseReport(args.jobs, args.duration, deadlines)
    with tempfile.TemporaryDirectory(prefix="halfcast-lease-") as tmp, scratch_database(args.admin_url) as db_url:
        token, data_dir = admin_token(db_url), Path(tmp) / "data"
        engine = make_engine(db_url)
        sessions = make_session_factory(engine)
        try:
            with (
                ApiProcess(db_url, data_dir) as api,
                WorkerProcess(db_url, data_dir, concurrency=args.jobs) as worker,
            ):
                job_ids = submit_jobs(api.url, token, args.jobs, training_spec())
                try:
                    wait_running(api.url, token, job_ids, START_TIMEOUT_S)
                    start = mark_steps(api.url, token, job_ids)
                    watch(sessions, report.deadlines, args.duration, args.interval)
                    report.steps_per_s = TrainingWindow.between(start, mark_steps(api.url, token, job_ids)).steps_per_s
                    report.jobs_running_at_end = args.jobs
                except RuntimeError as exc:  # a job no longer running: the report says so
                    log.warning("%s", exc)
                finally:
                    cancel_jobs(api.url, token, job_ids)
                lines = worker.log_path.read_text(errors="replace").splitlines()
                report.lease_lost_lines = [line for line in lines if LEASE_LOST_LINE in line]
            report.worker_lost_attempts = worker_lost_attempts(sessions)
        finally:
            engine.dispose()
    return report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m bench.lease_under_load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="CPU training jobs (the worker's concurrency)")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of training watched")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between two samples")
    parser.add_argument(
        "--admin-url", default=DEFAULT_ADMIN_URL, help="PostgreSQL URL to create the scratch database from"
    )
    parser.add_argument("--json", type=Path, help="write the report here")
    return parser.parse_args(argv)


def render(report: LeaseReport) -> str:
    """The report as a few lines of text."""
    d = report.deadlines
    return "\n".join(
        [
            f"{report.jobs} training job(s), {report.duration_s:.0f} s watched, {d.samples} samples, "
            f"{report.steps_per_s:.1f} steps/s together",
            f"lease: closest to expiry {d.min_lease_margin_s} s left (TTL {d.lease_ttl_s:.0f} s)",
            f"heartbeat: oldest {d.max_heartbeat_age_s} s (live window {d.worker_live_s:.0f} s)",
            f"worker_lost attempts: {report.worker_lost_attempts}; leases lost: {len(report.lease_lost_lines)}",
            "ok" if not report.problems else "FAILED: " + "; ".join(report.problems),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; 0 when no deadline was missed, 1 otherwise."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request of the steps' reads
    args = parse_args(argv)
    report = run_bench(args)
    if args.json:
        args.json.write_text(json.dumps(report.as_dict(), indent=2))
    sys.stdout.write(render(report) + "\n")
    return 0 if not report.problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
