"""Helper process for the GPU lock tests: ``python gpu_holder.py LOCK_DIR GPUS COUNT`` takes COUNT devices,
prints their indices (or ``none``), then sleeps until killed."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from worker.resources.gpu_locks import GpuLocks


def main() -> None:
    lock_dir, gpus, count = Path(sys.argv[1]), [int(g) for g in sys.argv[2].split(",")], int(sys.argv[3])
    lease = GpuLocks(lock_dir, gpus).try_acquire(count)
    print(",".join(map(str, lease.gpus)) if lease else "none", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
