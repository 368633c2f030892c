"""Simulated running jobs for the API load bench: claims and step records written as the worker writes them.

:func:`run_writer` (run it in a process of its own: :class:`Writer`) claims each job
with :class:`worker.store.JobStore` (``queued`` → ``starting``, a lease, an
``attempts`` row), marks it ``running``, then stores one step record every
``step_interval`` seconds (drawn uniformly from the range) through
``JobStore.record_progress``, the worker's own write (insert-or-ignore, fenced job
update of ``step``/``latest`` paced as the worker paces it, :mod:`worker.records.pacing`),
and an evaluation every :data:`EVAL_EVERY` steps, until told to stop. No torchrun is involved.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.synchronize
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from halfcast.contracts.records import EvalRecord, StepRecord
from halfcast.core.db.engine import make_engine
from halfcast.core.settings import Settings
from worker.records.pacing import JobRowPacing
from worker.store import Fence, JobStore, Progress

log = logging.getLogger(__name__)

#: An evaluation record every this many steps.
EVAL_EVERY = 50
#: The worker id the simulated attempts are claimed by.
WORKER_ID = "bench-writer/1"


@dataclass(frozen=True)
class WriterConfig:
    """What to write: the jobs, the step interval range in seconds, the database and a runs folder."""

    database_url: str
    job_ids: Sequence[str]
    runs_dir: Path
    step_interval_s: tuple[float, float] = (0.05, 0.1)
    #: The worker's ``HALFCAST_WORKER_PROGRESS_INTERVAL_S`` default: how often the job row takes the step.
    progress_interval_s: float = Settings.model_fields["worker_progress_interval_s"].default


def step_record(step: int) -> StepRecord:
    """A plausible fp16 step record for ``step``."""
    return StepRecord(
        step=step,
        time=time.time(),
        loss=2.3 / (1 + step / 50),
        loss_scale=65536.0,
        overflow=False,
        skipped_steps=0,
        grad_norm=0.7,
        lr=0.003,
        samples_per_second=5400.0,
        tokens_per_second=None,
        samples_total=64 * step,
        tokens_total=None,
    )


def _write_job(
    store: JobStore, fence: Fence, config: WriterConfig, stop: multiprocessing.synchronize.Event, counts: dict[str, int]
) -> None:
    """Append one record every step interval to the claimed job until ``stop`` is set."""
    step = 0
    low, high = config.step_interval_s
    pacing = JobRowPacing(config.progress_interval_s)
    while not stop.wait(random.uniform(low, high)):
        step += 1
        evals = (
            [EvalRecord(step=step, time=time.time(), loss=2.0 / (1 + step / 50), accuracy=0.5)]
            if step % EVAL_EVERY == 0
            else []
        )
        plan = pacing.plan(Progress(steps=[step_record(step)], evals=evals))
        if not store.record_progress(fence, plan.progress, job_row=plan.job_row):
            log.warning("job %s is no longer ours; its writer stops", fence.job_id)
            return
        pacing.written(plan)
        counts[fence.job_id] = step


def run_writer(config: WriterConfig, stop: multiprocessing.synchronize.Event, result: Any) -> None:
    """Claim every job, mark it running, write its records until ``stop``; put ``{job_id: steps}`` on ``result``."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    engine = make_engine(config.database_url)
    store = JobStore(engine)
    counts: dict[str, int] = {}
    threads = []
    for job_id in config.job_ids:
        claim = store.claim(job_id, WORKER_ID, config.runs_dir, lease_ttl_s=3600.0)
        if claim is None or not store.mark_running(claim.fence):
            raise RuntimeError(f"could not claim job {job_id}")
        thread = threading.Thread(target=_write_job, args=(store, claim.fence, config, stop, counts), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    engine.dispose()
    result.put(counts)


class Writer:
    """``with Writer(config) as writer:`` runs :func:`run_writer` in a spawned process; ``steps`` after the block."""

    def __init__(self, config: WriterConfig) -> None:
        context = multiprocessing.get_context("spawn")
        self.stop_event = context.Event()
        self.result = context.Queue()
        self.process = context.Process(target=run_writer, args=(config, self.stop_event, self.result), name="writer")
        self.steps: dict[str, int] = {}

    def __enter__(self) -> Writer:
        self.process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        try:
            self.steps = self.result.get(timeout=30)
        except Exception:  # noqa: BLE001  # the writer died: say so, but still stop it
            log.error("the writer process reported nothing (exit code %s)", self.process.exitcode)
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
