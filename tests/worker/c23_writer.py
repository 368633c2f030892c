"""Writer process of the C23 test: ``python c23_writer.py DB_URL GO_FILE JOB_ID:OWNER ...``.

One thread per job writes ``STEPS`` step records through ``JobStore`` (one record per
transaction, renewing the lease every 20 steps), after ``GO_FILE`` appears. Prints
``ready`` first; every error goes to stderr and makes the exit status 1.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from pathlib import Path

from halfcast.contracts.records import StepRecord
from halfcast.core.db.engine import make_engine
from worker.store import Fence, JobStore, Progress

STEPS = 200


def write_steps(store: JobStore, fence: Fence, errors: list[str]) -> None:
    """Write step records 1..STEPS for ``fence``'s job; append any failure to ``errors``."""
    try:
        store.mark_running(fence)
        for step in range(1, STEPS + 1):
            record = StepRecord(step=step, time=time.time(), loss=1.0 / step, loss_scale=1024.0)
            if not store.record_progress(fence, Progress(steps=[record])):
                errors.append(f"{fence.job_id}: step {step} was fenced out")
            if step % 20 == 0 and not store.renew_lease(fence, 30.0):
                errors.append(f"{fence.job_id}: lease lost at step {step}")
    except Exception:  # noqa: BLE001 - any failure is the writer's report, read by the test
        errors.append(traceback.format_exc())


def main(argv: list[str]) -> int:
    url, go_file, pairs = argv[0], Path(argv[1]), argv[2:]
    store = JobStore(make_engine(url))
    fences = [Fence(job_id, 1, owner) for job_id, owner in (pair.split(":", 1) for pair in pairs)]
    errors: list[str] = []
    threads = [threading.Thread(target=write_steps, args=(store, fence, errors)) for fence in fences]
    print("ready", flush=True)
    while not go_file.exists():
        time.sleep(0.01)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for error in errors:
        sys.stderr.write(error + "\n")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
