"""Slots: CPU jobs up to the concurrency, GPU jobs on free devices; a job waits queued, unclaimed, for its slot."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update
from worker_support import MakeJob, small_spec

from halfcast.contracts.spec import JobSpec
from halfcast.core.db.models import Attempt, Job
from halfcast.core.settings import Settings
from worker.resources.gpu_locks import GpuLocks
from worker.resources.placement import Placement, Placer, SlotUnavailable
from worker.resources.slots import Slots
from worker.runner import RunnerContext, run_job
from worker.store import JobStore


def _slots(tmp_path: Path, gpus: list[int], concurrency: int = 1) -> Slots:
    return Slots(concurrency, GpuLocks(tmp_path / "locks", gpus))


def test_cpu_jobs_run_up_to_the_concurrency(tmp_path: Path) -> None:
    slots = _slots(tmp_path, [], concurrency=2)
    first, second = slots.try_place(0), slots.try_place(0)
    assert first is not None and second is not None and first.gpus == ()
    assert slots.try_place(0) is None
    first.release()
    first.release()  # idempotent: frees one slot, once
    third = slots.try_place(0)
    assert third is not None and slots.try_place(0) is None
    assert slots.threads == 2 and _slots(tmp_path, [0, 1], concurrency=2).threads == 4


def test_gpu_jobs_take_no_cpu_slot(tmp_path: Path) -> None:
    slots = _slots(tmp_path, [0, 1], concurrency=1)
    cpu, gpu = slots.try_place(0), slots.try_place(2)
    assert cpu is not None and gpu is not None and gpu.gpus == (0, 1)
    assert slots.try_place(1) is None and slots.try_place(0) is None


def _placer(slots: Slots, store: JobStore, wait_s: float = 5.0, stop: threading.Event | None = None) -> Placer:
    return Placer(slots, store.queued_gpus, wait_s, 0.02, stop or threading.Event())


def test_a_gpu_job_waits_queued_while_its_device_is_busy(tmp_path: Path, store: JobStore, make_job: MakeJob) -> None:
    """HALFCAST_WORKER_GPUS="0": one job holds the GPU; the next waits unclaimed and gets it when freed."""
    slots = _slots(tmp_path, [0])
    busy = slots.try_place(1)
    assert busy is not None
    job_id = make_job(small_spec(gpus=1))
    placed: list[Placement | None] = []
    waiter = threading.Thread(target=lambda: placed.append(_placer(slots, store).place(job_id)))
    waiter.start()
    time.sleep(0.3)
    assert placed == [] and store.status(job_id) == "queued"  # waiting: not claimed, lease not taken
    busy.release()
    waiter.join(timeout=5)
    assert len(placed) == 1 and placed[0] is not None and placed[0].gpus == (0,)


def test_no_slot_in_time_hands_the_job_back(tmp_path: Path, store: JobStore, make_job: MakeJob) -> None:
    slots = _slots(tmp_path, [0])
    busy = slots.try_place(1)
    job_id = make_job(small_spec(gpus=1))
    started = time.monotonic()
    with pytest.raises(SlotUnavailable, match="1 GPU"):
        _placer(slots, store, wait_s=0.2).place(job_id)
    assert 0.2 <= time.monotonic() - started < 3 and store.status(job_id) == "queued"
    with pytest.raises(SlotUnavailable):  # more GPUs than this worker has: never placed here
        _placer(_slots(tmp_path / "other", [0]), store, wait_s=0.0).place(make_job(small_spec(gpus=2)))
    assert busy is not None


def test_waiting_ends_at_shutdown_and_at_cancel(
    tmp_path: Path, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    slots = _slots(tmp_path, [0])
    busy = slots.try_place(1)
    job_id = make_job(small_spec(gpus=1))
    stop = threading.Event()
    stop.set()
    with pytest.raises(SlotUnavailable, match="shutting down"):
        _placer(slots, store, wait_s=30.0, stop=stop).place(job_id)
    result: list[object] = []
    waiter = threading.Thread(target=lambda: result.append(_placer(slots, store, wait_s=30.0).place(job_id)))
    waiter.start()
    time.sleep(0.2)
    with engine.begin() as conn:
        conn.execute(update(Job).where(Job.id == job_id).values(status="cancelled"))
    waiter.join(timeout=5)
    assert result == [None]  # dropped: a cancelled job is never claimed
    assert busy is not None


def _env_command(spec: JobSpec, spec_path: Path, run_dir: Path) -> list[str]:
    code = "import os, pathlib; pathlib.Path('cuda.txt').write_text(os.environ['CUDA_VISIBLE_DEVICES']); raise SystemExit(3)"
    return [sys.executable, "-c", code]


def test_the_attempt_gets_and_records_exactly_its_devices(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    job_id = make_job(small_spec(gpus=2))
    context = RunnerContext(settings=settings, store=store, worker_id="w/1", build_command=_env_command, gpus=(3, 1))
    outcome = run_job(job_id, context)
    assert outcome is not None and outcome.reason == "rank_failed"
    run_dir = settings.runs_dir / job_id / "attempt-1"
    assert (run_dir / "cuda.txt").read_text() == "3,1"
    with engine.connect() as conn:
        assert conn.execute(select(Attempt.gpus).where(Attempt.job_id == job_id)).scalar_one() == [3, 1]


def test_a_cpu_attempt_records_no_devices(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    job_id = make_job(small_spec())
    run_job(job_id, RunnerContext(settings=settings, store=store, worker_id="w/1", build_command=_env_command))
    assert (settings.runs_dir / job_id / "attempt-1" / "cuda.txt").read_text() == ""
    with engine.connect() as conn:
        assert conn.execute(select(Attempt.gpus).where(Attempt.job_id == job_id)).scalar_one() is None
