"""Peak memory of one LoRA path, measured in a fresh Python process of its own.

CPU (the benchmark's device): torch's CPU allocator is invisible to ``tracemalloc``, so the
measure is the process's resident-set high-water mark (Linux ``VmHWM``). The child imports
everything, writes the model and loads the micro-batches, then resets the high-water mark
(``/proc/self/clear_refs`` = 5) and records its RSS; it builds the path and runs
``steps`` steps; the peak is ``VmHWM`` minus that RSS: model, adapter, optimizer state,
activations and the framework's own objects of that path alone. Where the reset is not
possible, ``ru_maxrss`` deltas are used (an underestimate if imports peaked higher) and the
result says so. On CUDA the same quantity would be ``torch.cuda.max_memory_allocated``
after ``reset_peak_memory_stats``; the benchmark's paths run on the CPU.

``python -m bench.lora_memory NAME WORKLOAD_JSON STEPS`` prints one JSON line.
"""

from __future__ import annotations

import gc
import json
import resource
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.lora_workload import LoraWorkload, make_batches, save_model

_PROC = Path("/proc/self")
#: Seconds a child measurement may take.
CHILD_TIMEOUT_S = 600


def _status_kib(field: str) -> int | None:
    """``field`` (``VmHWM``, ``VmRSS``) of ``/proc/self/status`` in KiB, or ``None`` off Linux."""
    try:
        for line in (_PROC / "status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_high_water_mark() -> bool:
    """Reset ``VmHWM`` to the current RSS; False when the kernel does not allow it."""
    try:
        (_PROC / "clear_refs").write_text("5")
    except OSError:
        return False
    return True


def measure_here(name: str, work: LoraWorkload, steps: int) -> dict[str, Any]:
    """Build path ``name`` in this process and run ``steps`` steps; its peak memory in MiB and how it was measured."""
    from bench.lora import build_lora_runner
    from bench.measure import BatchCycle, run_steps

    _import_libraries(name)
    with tempfile.TemporaryDirectory(prefix="halfcast-bench-mem-") as tmp:
        root = Path(tmp)
        save_model(work, root)
        cycle = BatchCycle(make_batches(work))
        gc.collect()
        exact = _reset_high_water_mark() and _status_kib("VmRSS") is not None
        base = _status_kib("VmRSS") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        runner = build_lora_runner(name, work, root)
        try:
            run_steps(runner, cycle, steps)
        finally:
            runner.close()
        peak = _status_kib("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    method = "VmHWM after reset, minus RSS before the build" if exact else "ru_maxrss delta (lower bound)"
    return {"peak_mib": ((peak or 0) - (base or 0)) / 1024, "method": method, "steps": steps}


def _import_libraries(name: str) -> None:
    """Import what every path uses before the measurement starts, so no path's peak holds import costs."""
    import importlib

    import peft  # noqa: F401
    import transformers

    from bench.lora import LORA_PEERS

    _ = transformers.Trainer, transformers.TrainingArguments, transformers.AutoModelForCausalLM
    importlib.import_module(LORA_PEERS[name][0])


def measure_in_subprocess(name: str, work: LoraWorkload, steps: int, threads: int) -> dict[str, Any]:
    """:func:`measure_here` in a fresh interpreter (``{"error": ...}`` if it failed)."""
    command = [
        sys.executable,
        "-m",
        "bench.lora_memory",
        name,
        json.dumps(_workload_json(work)),
        str(steps),
        str(threads),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def _workload_json(work: LoraWorkload) -> dict[str, Any]:
    fields = asdict(work)
    fields["target_modules"] = list(work.target_modules)
    return fields


def main(argv: list[str] | None = None) -> int:
    """Child entry point: ``NAME WORKLOAD_JSON STEPS THREADS``; prints :func:`measure_here` as JSON."""
    import torch

    name, raw, steps, threads = argv if argv is not None else sys.argv[1:]
    torch.set_num_threads(int(threads))
    fields = json.loads(raw)
    fields["target_modules"] = tuple(fields["target_modules"])
    result = measure_here(name, LoraWorkload(**fields), int(steps))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
