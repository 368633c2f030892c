"""Real training beside the API load bench's pollers (issue 31): a worker, CPU jobs and their training rate.

:class:`WorkerProcess` runs ``python -m halfcast.cli worker`` (what ``halfcast worker`` runs) on the
API's data directory (the embedded filesystem broker) and database, so the jobs submitted through
the API train for real, on this host, at the worker's run priority (``HALFCAST_RUN_NICE``, default
10). :func:`training_spec` is the fp16 digits example with a step budget no bench reaches (the jobs
train until :func:`cancel_jobs`). :func:`mark_steps` reads the jobs' newest step records through the
API, so a window's training rate is the steps between two marks over the seconds between their
records' own times. (Not the job's ``step`` at the time of the read: the worker sets the job row at
most once per ``HALFCAST_WORKER_PROGRESS_INTERVAL_S``, so it lags the training by up to a second,
±5% of a 20 s window; the records are stored as they come, each with the time its step was issued.)
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from bench.load_stack import ROOT, log_tail, process_environment, stop_process
from halfcast.core.db.models import TERMINAL_STATUSES

log = logging.getLogger(__name__)

#: The step budget of a bench training job: more than any bench runs (they are cancelled at the end).
TRAINING_MAX_STEPS = 1_000_000
#: Seconds the worker gets to stop after SIGTERM (its runs cancelled before) before it is killed.
STOP_TIMEOUT_S = 60.0
#: Seconds the jobs get to end after their cancel.
CANCEL_TIMEOUT_S = 60.0


def training_spec() -> dict[str, Any]:
    """The fp16 digits example, training until cancelled: no evaluation or checkpoint in the measured windows."""
    spec: dict[str, Any] = json.loads((ROOT / "examples" / "digits-fp16.json").read_text())
    spec.update(
        name="bench-training",
        max_steps=TRAINING_MAX_STEPS,
        eval_interval=TRAINING_MAX_STEPS,
        checkpoint_interval=TRAINING_MAX_STEPS,
    )
    return spec


class WorkerProcess:
    """``with WorkerProcess(database_url, data_dir, concurrency=2) as worker:`` runs a worker until the block ends.

    ``env`` adds ``HALFCAST_*`` settings (``HALFCAST_RUN_NICE=0`` measures training at the API's
    priority); ``root`` is the source tree it runs from. Its output goes to ``<data_dir>/worker.log``.
    """

    def __init__(
        self,
        database_url: str,
        data_dir: Path,
        *,
        concurrency: int,
        env: Mapping[str, str] | None = None,
        root: Path = ROOT,
    ) -> None:
        self.data_dir = data_dir
        self.log_path = data_dir / "worker.log"
        self.command = [
            sys.executable,
            "-m",
            "halfcast.cli",
            "--log-level",
            "WARNING",
            "worker",
            "--data-dir",
            str(data_dir),
        ]
        settings = {"HALFCAST_WORKER_CONCURRENCY": str(concurrency), **(env or {})}
        self.env = process_environment(database_url, settings, root)
        self.root = root
        self.popen: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.popen = subprocess.Popen(
                self.command, env=self.env, cwd=self.root, stdout=out, stderr=subprocess.STDOUT
            )
        log.info("worker started (pid %d)", self.popen.pid)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM the worker; SIGKILL it after :data:`STOP_TIMEOUT_S`."""
        stop_process(self.popen, "the worker", STOP_TIMEOUT_S)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the worker's output."""
        return log_tail(self.log_path, lines)


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


#: The most step records one ``GET /jobs/{id}/metrics`` returns (the API's ``limit`` bound).
METRICS_PAGE = 10_000


@dataclass(frozen=True)
class StepMark:
    """The jobs' steps together, as their newest step records tell, and when: the records' mean ``time``."""

    steps: int
    time: float


def mark_steps(url: str, token: str, job_ids: Sequence[str]) -> StepMark:
    """The jobs' newest step records; raises if a job is no longer running or has none."""
    with _client(url, token) as client:
        newest = [_newest_record(client, job_id) for job_id in job_ids]
    return StepMark(sum(step for step, _ in newest), sum(at for _, at in newest) / len(newest))


def _newest_record(client: httpx.Client, job_id: str) -> tuple[int, float]:
    """The step and ``time`` of ``job_id``'s newest step record (paged on from the job row's step)."""
    job = client.get(f"/jobs/{job_id}").json()
    if job["status"] != "running":
        raise RuntimeError(f"training job {job_id} is {job['status']}: {job.get('error_message')}")
    after, newest = max(0, int(job["step"]) - 1), None
    while True:
        params = {"after_step": after, "limit": METRICS_PAGE}
        points = client.get(f"/jobs/{job_id}/metrics", params=params).json()["points"]
        if points:
            newest, after = points[-1], int(points[-1]["step"])
        if len(points) < METRICS_PAGE:
            break
    if newest is None or newest.get("time") is None:
        raise RuntimeError(f"training job {job_id} has no timed step record after step {after}")
    return int(newest["step"]), float(newest["time"])


@dataclass(frozen=True)
class TrainingWindow:
    """The jobs' steps at the start and end of a window, and its seconds."""

    steps_before: int
    steps_after: int
    seconds: float

    @classmethod
    def between(cls, start: StepMark, end: StepMark) -> TrainingWindow:
        """The window from ``start`` to ``end``, timed by their records."""
        return cls(start.steps, end.steps, end.time - start.time)

    @property
    def steps_per_s(self) -> float:
        """The jobs' training rate over the window, together."""
        return (self.steps_after - self.steps_before) / self.seconds if self.seconds > 0 else 0.0


def quiet_window(url: str, token: str, job_ids: Sequence[str], seconds: float) -> TrainingWindow:
    """The jobs' training rate over about ``seconds`` with no poller (two marks of their steps)."""
    start = mark_steps(url, token, job_ids)
    time.sleep(seconds)
    return TrainingWindow.between(start, mark_steps(url, token, job_ids))


def cancel_jobs(url: str, token: str, job_ids: Sequence[str]) -> None:
    """Cancel the jobs and wait (up to :data:`CANCEL_TIMEOUT_S`) until each is terminal."""
    with _client(url, token) as client:
        for job_id in job_ids:
            client.post(f"/jobs/{job_id}/cancel")
        deadline = time.monotonic() + CANCEL_TIMEOUT_S
        while time.monotonic() < deadline:
            statuses = [client.get(f"/jobs/{job_id}").json()["status"] for job_id in job_ids]
            if all(status in TERMINAL_STATUSES for status in statuses):
                return
            time.sleep(0.5)
    log.warning("training jobs not terminal %.0f s after their cancel", CANCEL_TIMEOUT_S)
