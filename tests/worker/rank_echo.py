"""A tiny torchrun entry point for the per-rank log tests: ``python -m rank_echo --spec S --run-dir D``.

Each rank writes ``rank <r> out <i>`` to stdout and ``rank <r> err <i>`` to stderr,
interleaved (three of each), plus a last line without a newline. With the spec name
``rank-1-fails`` rank 1 then prints ``boom from rank 1`` to stderr and exits 1, while
rank 0 waits to be stopped by torchrun.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    args = parser.parse_args()
    name = json.loads(args.spec.read_text()).get("name") or ""
    rank = int(os.environ["RANK"])
    for i in range(3):
        print(f"rank {rank} out {i}", flush=True)
        print(f"rank {rank} err {i}", file=sys.stderr, flush=True)
    sys.stdout.write(f"rank {rank} partial")
    sys.stdout.flush()
    if name == "rank-1-fails":
        if rank == 1:
            print("\nboom from rank 1", file=sys.stderr, flush=True)
            return 1
        time.sleep(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
