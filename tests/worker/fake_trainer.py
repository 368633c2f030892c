"""A stand-in for ``python -m trainer`` that honours the run-directory contract (docs/architecture.md).

Usage: ``python fake_trainer.py --spec S --run-dir D``. Behaviour is chosen by the spec:
``faults.sleep_per_step_s`` slows it down, ``faults.raise_at_step`` crashes with a
traceback, and the spec ``name`` selects special cases: ``typed-error`` writes
``error.json``; ``no-end`` exits 0 without an ``end`` record; ``stubborn`` starts a
grandchild that ignores SIGTERM; ``partial`` leaves a half-written last line. It writes its pid to ``trainer.pid``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    args = parser.parse_args()
    spec = json.loads(args.spec.read_text())
    faults = spec.get("faults") or {}
    name = spec.get("name") or ""
    (args.run_dir / "trainer.pid").write_text(str(os.getpid()))
    records = (args.run_dir / "records.jsonl").open("a")

    def write(record: dict) -> None:
        records.write(json.dumps(record) + "\n")
        records.flush()

    if name == "stubborn":
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
        subprocess.Popen([sys.executable, "-c", code])
    write({"type": "start", "time": time.time(), "world_size": spec.get("processes", 1)})
    for step in range(1, spec["max_steps"] + 1):
        if faults.get("raise_at_step") == step:
            raise RuntimeError(f"injected failure at step {step}")
        time.sleep(faults.get("sleep_per_step_s", 0.0))
        write({"type": "step", "step": step, "time": time.time(), "loss": 1.0 / step, "loss_scale": 2.0**16,
               "overflow": False, "skipped_steps": 0, "grad_norm": 0.5, "lr": 0.1, "samples_per_second": 100.0,
               "tokens_per_second": None})
    if name == "typed-error":
        error = {"reason": "nonfinite_gradients", "message": "gradients were non-finite on 50 steps", "rank": 0}
        (args.run_dir / "error.json").write_text(json.dumps(error))
        print("giving up: non-finite gradients", file=sys.stderr)
        return 3
    write({"type": "eval", "step": spec["max_steps"], "time": time.time(), "loss": 0.1, "accuracy": 0.95})
    if name == "partial":
        records.write('{"type": "end", "ti')
        records.flush()
        return 0
    if name != "no-end":
        write({"type": "end", "time": time.time(), "steps": spec["max_steps"], "skipped_steps": 0})
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.exit(main())
