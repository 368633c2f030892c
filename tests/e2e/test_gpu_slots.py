"""A real worker configured with one (pretend) GPU: a GPU job waits queued while its GPU is held, then runs on it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import Stack, load_example

from conftest import make_stack

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
HOLDER = ROOT / "tests" / "worker" / "gpu_holder.py"


@pytest.fixture(scope="module")
def one_gpu_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The embedded stack whose worker hands out GPU 0 (HALFCAST_WORKER_GPUS=0) and waits 1 s for a slot."""
    yield from make_stack(tmp_path_factory.mktemp("one-gpu"), worker_gpus="0", worker_slot_wait_s="1")


def test_a_gpu_job_stays_queued_while_its_gpu_is_held_then_gets_it(one_gpu_stack: Stack) -> None:
    workers = one_gpu_stack.client.get("/workers").json()["workers"]
    assert [w["gpus"] for w in workers] == [[0]]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    lock_dir = one_gpu_stack.data_dir / "gpu-locks"
    holder = subprocess.Popen(
        [sys.executable, str(HOLDER), str(lock_dir), "0", "1"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "0"  # another job holds GPU 0
        spec = load_example("synthetic-fp16.json", gpus=1, max_steps=2)
        job_id = one_gpu_stack.submit(spec)["id"]
        time.sleep(4)  # several slot waits: the message goes round the queue, the job is never claimed
        job = one_gpu_stack.client.get(f"/jobs/{job_id}").json()
        assert (job["status"], job["attempt"]) == ("queued", 0)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    job = one_gpu_stack.wait_terminal(job_id)  # on this CPU host the trainer finds no CUDA device and fails
    assert job["attempts"][0]["gpus"] == [0], job
    assert job["attempt"] == 1
