"""Host-wide GPU slots held with flock: exclusive, all or none, released on exit and on process death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from worker_support import present

from worker.launch.process_tree import start_run
from worker.resources.gpu_locks import GpuLocks

ROOT = Path(__file__).resolve().parents[2]
HOLDER = Path(__file__).with_name("gpu_holder.py")


def test_two_allocations_never_share_a_device(tmp_path: Path) -> None:
    locks = GpuLocks(tmp_path, [0, 1, 2])
    first = locks.try_acquire(2)
    second = locks.try_acquire(1)
    assert first is not None and second is not None
    assert first.gpus == (0, 1) and second.gpus == (2,)
    assert locks.try_acquire(1) is None  # every device is taken


def test_an_allocation_takes_all_it_needs_or_nothing(tmp_path: Path) -> None:
    locks = GpuLocks(tmp_path, [0, 1])
    held = locks.try_acquire(1)
    assert held is not None and held.gpus == (0,)
    assert locks.try_acquire(2) is None  # only one is free: none is taken
    rest = locks.try_acquire(1)
    assert rest is not None and rest.gpus == (1,)  # the free one was given back by the failed attempt
    assert locks.try_acquire(3) is None  # more than the worker has
    with pytest.raises(ValueError):
        locks.try_acquire(0)


def test_release_frees_the_devices_on_every_exit_path(tmp_path: Path) -> None:
    locks = GpuLocks(tmp_path, [0])
    lease = locks.try_acquire(1)
    assert lease is not None
    lease.release()
    lease.release()  # idempotent
    with pytest.raises(RuntimeError), present(locks.try_acquire(1)):
        assert locks.try_acquire(1) is None
        raise RuntimeError("the attempt failed")
    again = locks.try_acquire(1)
    assert again is not None and again.gpus == (0,)


def test_threads_allocating_at_once_never_overlap(tmp_path: Path) -> None:
    locks = GpuLocks(tmp_path, [0, 1, 2, 3])
    holding: dict[int, int] = {}
    guard = threading.Lock()
    overlaps: list[tuple[int, int]] = []
    grants = [0] * 6
    deadline = time.monotonic() + 20

    def churn(me: int) -> None:
        while grants[me] < 25 and time.monotonic() < deadline:
            lease = locks.try_acquire(1 + (me + grants[me]) % 2)
            if lease is None:
                continue
            with guard:
                grants[me] += 1
                for gpu in lease.gpus:
                    if gpu in holding:
                        overlaps.append((gpu, holding[gpu]))
                    holding[gpu] = me
            time.sleep(0.001)  # hold the devices a moment, as a job would
            with guard:
                for gpu in lease.gpus:
                    holding.pop(gpu, None)
            lease.release()

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(len(grants))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == [] and grants == [25] * len(grants), (overlaps[:3], grants)


def _hold(lock_dir: Path, gpus: str, count: int) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, str(HOLDER), str(lock_dir), gpus, str(count)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    return process, process.stdout.readline().strip()


def test_another_process_holding_a_device_excludes_it_until_it_is_killed(tmp_path: Path) -> None:
    locks = GpuLocks(tmp_path, [0, 1])
    process, taken = _hold(tmp_path, "0,1", 1)
    try:
        assert taken == "0"
        lease = locks.try_acquire(1)
        assert lease is not None and lease.gpus == (1,)  # the other process's device is skipped
        assert locks.try_acquire(1) is None
        process.send_signal(signal.SIGKILL)  # no cleanup runs: the kernel drops the lock
        process.wait(timeout=10)
        deadline = time.monotonic() + 5
        while (freed := locks.try_acquire(1)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert freed is not None and freed.gpus == (0,)
    finally:
        process.kill()
        process.wait(timeout=10)


def test_a_process_cannot_take_what_this_one_holds(tmp_path: Path) -> None:
    locks = GpuLocks(tmp_path, [0, 1])
    lease = locks.try_acquire(2)
    assert lease is not None
    process, taken = _hold(tmp_path, "0,1", 1)
    process.kill()
    process.wait(timeout=10)
    assert taken == "none"


def test_a_run_inheriting_the_locks_keeps_its_devices_after_the_worker_died(tmp_path: Path) -> None:
    """The worker dies (its descriptors close without an unlock) while its run still lives: the GPU stays taken.

    The run is started as the worker starts it (:func:`worker.launch.process_tree.start_run`, through the
    death-signal wrapper's ``exec``); only when the run is gone is the device free again.
    """
    locks = GpuLocks(tmp_path / "locks", [0])
    lease = locks.try_acquire(1)
    assert lease is not None
    run_dir = tmp_path / "run"
    run = start_run(["sleep", "60"], run_dir, {"PATH": os.environ["PATH"]}, pass_fds=lease.descriptors)
    try:
        for descriptor in lease.descriptors:
            os.close(descriptor)  # what the kernel does when the worker dies: no LOCK_UN
        assert locks.try_acquire(1) is None, "the device was free while its run still ran"
    finally:
        assert run.stop(5.0)
    again = locks.try_acquire(1)
    assert again is not None and again.gpus == (0,)


def test_the_workers_release_frees_a_device_its_run_still_holds_a_descriptor_of(tmp_path: Path) -> None:
    """The attempt ended (the worker unlocks): the inherited descriptor does not keep the device taken."""
    locks = GpuLocks(tmp_path / "locks", [0])
    lease = locks.try_acquire(1)
    assert lease is not None
    child = subprocess.Popen(["sleep", "60"], pass_fds=lease.descriptors)
    try:
        lease.release()
        again = locks.try_acquire(1)
        assert again is not None and again.gpus == (0,)
    finally:
        child.kill()
        child.wait()
