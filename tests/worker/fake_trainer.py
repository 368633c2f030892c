"""A stand-in for ``python -m trainer`` that honours the run-directory contract (docs/architecture.md).

Usage: ``python fake_trainer.py --spec S --run-dir D [--resume-from CKPT]``. Behaviour is chosen
by the spec: ``faults.sleep_per_step_s`` slows it down, ``faults.raise_at_step`` crashes with a
traceback, ``checkpoint_interval`` writes ``checkpoints/step-<N>.pt`` (text files holding N), and
``--resume-from`` continues after the checkpoint's step. The spec ``name`` selects special cases:
``typed-error`` writes ``error.json``; ``no-end`` exits 0 without an ``end`` record;
``slow-teardown`` lingers 600 s after it; ``nothing-applied`` skips every step and writes the
``end`` record of an older trainer (no ``applied_steps``), which counts no applied update
(``nothing-applied-slow-teardown`` then lingers too); ``stubborn``
starts a grandchild that ignores SIGTERM; ``partial`` leaves a half-written last line; ``oom`` and
``collective-timeout`` die at step 2 printing what PyTorch prints for those. It writes its pid to
``trainer.pid``, and the start-up ``phase`` records (each phase 0.01 s) as the trainer does.
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

#: What a rank prints when it dies of these causes (PyTorch's own messages).
DEATHS = {
    "oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.10 GiB total capacity)",
    "collective-timeout": "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
    "Timed out waiting 1800000ms for recv operation to complete",
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--resume-from", type=Path, default=None)
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
    done = int(args.resume_from.read_text()) if args.resume_from else 0
    skipping = name.startswith("nothing-applied")
    times = dict.fromkeys(("launch_s", "imports_s", "data_s", "model_s", "first_step_s"))
    for phase, ended in (("data", "imports_s"), ("model", "data_s"), ("first_step", "model_s")):
        times[ended] = 0.01
        write({"type": "phase", "time": time.time(), "phase": phase, "startup": times})
    write(
        {
            "type": "start",
            "time": time.time(),
            "world_size": spec.get("processes", 1),
            "resumed_from_step": done,
            "startup": times,
        }
    )
    for step in range(done + 1, spec["max_steps"] + 1):
        if faults.get("raise_at_step") == step:
            raise RuntimeError(f"injected failure at step {step}")
        if name in DEATHS and step == 2:
            print(DEATHS[name], file=sys.stderr, flush=True)
            return 1
        time.sleep(faults.get("sleep_per_step_s", 0.0))
        write(
            {
                "type": "step",
                "step": step,
                "time": time.time(),
                "loss": 1.0 / step,
                "loss_scale": 2.0**16,
                "overflow": skipping,
                "skipped_steps": step if skipping else 0,
                "grad_norm": None if skipping else 0.5,
                "lr": 0.1,
                "samples_per_second": 100.0,
                "tokens_per_second": None,
            }
        )
        if step == done + 1:
            write(
                {"type": "phase", "time": time.time(), "phase": "training", "startup": {**times, "first_step_s": 0.01}}
            )
        if spec.get("checkpoint_interval") and step % spec["checkpoint_interval"] == 0:
            (args.run_dir / "checkpoints").mkdir(exist_ok=True)
            (args.run_dir / "checkpoints" / f"step-{step}.pt").write_text(str(step))
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
        skipped = spec["max_steps"] if skipping else 0
        write({"type": "end", "time": time.time(), "steps": spec["max_steps"], "skipped_steps": skipped})
    if name.endswith("slow-teardown"):
        time.sleep(600)  # a tear-down (process group, file handles) that lingers after the end record
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.exit(main())
