"""CLI: Halfcast's fixed host cost per step against the hand loop's, on a model too small to compute.

``python -m bench.host_overhead --precisions fp32,bf16,fp16 --json out.json`` builds the hand loop and
Halfcast (:mod:`bench.peers`) on a tiny MLP (16 → 32 → 10, micro-batch 8: the GEMMs take microseconds,
so a step's time is the host's dispatch and Python work), counts the aten operators one steady step
dispatches on each path (:class:`bench.op_counter.OpCounter`; Halfcast's flush counted apart, per
flush) and times both in interleaved rounds (:mod:`bench.measure`, flushes included). Reported per
precision: ops/step, µs/step (median over rounds; by default this thread's CPU time, ``--clock wall``
for elapsed time) and the median (min–max) over rounds of Halfcast's per-round extra µs over the hand loop.
``--model lora`` does the same on the LoRA workload
(:mod:`bench.lora_workload`, tiny Llama; needs transformers and peft).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard, get_args

import torch

from bench.measure import BatchCycle, interleaved_times, median, run_steps
from bench.op_counter import OpCounter
from bench.peers.base import Runner
from bench.report import machine_info
from bench.workload import BenchPrecision
from trainer.data import Batch

log = logging.getLogger(__name__)

PATHS = ("hand", "halfcast")

#: ``--clock``: the step's own CPU time (a loaded machine delays it but does not add to it), or wall time.
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}


@dataclass(frozen=True)
class PathCost:
    """One path at one precision: operators per steady step and per flush, µs per step per round."""

    ops_per_step: int
    ops_per_flush: int
    top_ops: list[tuple[str, int]]
    us_per_step: list[float]


def is_precision(name: str) -> TypeGuard[BenchPrecision]:
    """Whether ``name`` is one of the workloads' precisions (fp16, bf16, fp32)."""
    return name in get_args(BenchPrecision)


def precision_list(text: str) -> list[BenchPrecision]:
    """``--precisions``: the comma-separated precisions, each checked."""
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if not is_precision(name)]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown precision(s) {', '.join(unknown)}: expected fp32, bf16 or fp16")
    return [name for name in names if is_precision(name)]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The CLI's options (see ``--help``)."""
    parser = argparse.ArgumentParser(prog="python -m bench.host_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--precisions", type=precision_list, default="fp32,bf16,fp16", help="comma-separated subset of fp32,bf16,fp16"
    )
    parser.add_argument("--model", choices=("mlp", "lora"), default="mlp")
    parser.add_argument("--steps", type=int, default=50, help="steps per path per round (a multiple of 10)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="cpu",
        help="cpu: this thread's CPU time (robust to other load; needs --threads 1); wall: elapsed",
    )
    parser.add_argument("--json", type=Path, help="write every number here")
    return parser.parse_args(argv)


@contextmanager
def mlp_builders(precision: BenchPrecision, total_steps: int) -> Iterator[tuple[Callable[[str], Runner], list[Batch]]]:
    """Runner factory and batches of the tiny MLP workload."""
    from bench.peers import build_runner
    from bench.workload import Workload, make_batches

    work = Workload(
        precision=precision,
        in_features=16,
        hidden_sizes=(32,),
        micro_batch_size=8,
        total_steps=total_steps,
    )
    yield (lambda name: build_runner(name, work)), make_batches(work)


@contextmanager
def lora_builders(precision: BenchPrecision, total_steps: int) -> Iterator[tuple[Callable[[str], Runner], list[Batch]]]:
    """Runner factory and batches of the LoRA workload (its model written to a temporary root)."""
    from bench.lora import build_lora_runner
    from bench.lora_workload import LoraWorkload, make_batches, save_model

    work = LoraWorkload(precision=precision, total_steps=total_steps)
    with tempfile.TemporaryDirectory(prefix="halfcast-bench-ops-") as tmp:
        save_model(work, Path(tmp))
        yield (lambda name: build_lora_runner(name, work, Path(tmp))), make_batches(work)


def count_ops(runner: Runner, cycle: BatchCycle, steps: int = 10) -> tuple[int, int, list[tuple[str, int]]]:
    """Largest operator count of one steady step over ``steps`` steps, largest per flush, and the
    step's ten most frequent operators."""
    worst, flush_ops, top = 0, 0, []
    for _ in range(steps):
        with OpCounter() as step_ops:
            runner.step(cycle.next())
        with OpCounter() as flush:
            flushed = runner.maybe_flush()
        if step_ops.total >= worst:
            worst, top = step_ops.total, step_ops.counts.most_common(10)
        if flushed:
            flush_ops = max(flush_ops, flush.total)
    return worst, flush_ops, top


def measure_precision(precision: BenchPrecision, model: str, args: argparse.Namespace) -> dict[str, PathCost]:
    """Ops and per-round µs/step of the hand loop and Halfcast at ``precision``."""
    total = args.warmup + args.steps * args.rounds + 100
    builders = mlp_builders if model == "mlp" else lora_builders
    with builders(precision, total) as (build, batches):
        runners = {name: build(name) for name in PATHS}
        try:
            cycles = {name: BatchCycle(batches) for name in PATHS}
            for name in PATHS:
                run_steps(runners[name], cycles[name], args.warmup)
            counted = {name: count_ops(runners[name], cycles[name]) for name in PATHS}
            times = interleaved_times(runners, cycles, args.steps, args.rounds, CLOCKS[args.clock])
        finally:
            for runner in runners.values():
                runner.close()
    return {
        name: PathCost(counted[name][0], counted[name][1], counted[name][2], [t * 1e6 for t in times[name]])
        for name in PATHS
    }


def summary(costs: Mapping[str, PathCost]) -> dict[str, Any]:
    """The row of one precision: both paths' ops and median µs, and Halfcast's extra µs per round."""
    hand, halfcast = costs["hand"], costs["halfcast"]
    extra = [h - r for h, r in zip(halfcast.us_per_step, hand.us_per_step, strict=True)]
    return {
        "hand_ops": hand.ops_per_step,
        "halfcast_ops": halfcast.ops_per_step,
        "halfcast_ops_per_flush": halfcast.ops_per_flush,
        "hand_us": median(hand.us_per_step),
        "halfcast_us": median(halfcast.us_per_step),
        "extra_us": median(extra),
        "extra_us_min": min(extra),
        "extra_us_max": max(extra),
        "hand_top_ops": hand.top_ops,
        "halfcast_top_ops": halfcast.top_ops,
        "us_per_step": {"hand": hand.us_per_step, "halfcast": halfcast.us_per_step},
    }


def markdown(rows: Mapping[str, Mapping[str, Any]]) -> str:
    """The table of every precision."""
    lines = [
        "| precision | hand ops/step | Halfcast ops/step | Halfcast ops/flush | hand µs/step | Halfcast µs/step "
        "| Halfcast - hand, µs/step: median (range) |",
        "|---|---|---|---|---|---|---|",
    ]
    for precision, row in rows.items():
        lines.append(
            f"| {precision} | {row['hand_ops']} | {row['halfcast_ops']} | {row['halfcast_ops_per_flush']} "
            f"| {row['hand_us']:.0f} | {row['halfcast_us']:.0f} | {row['extra_us']:+.0f} "
            f"({row['extra_us_min']:+.0f} – {row['extra_us_max']:+.0f}) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every precision asked; the table to stdout, every number to ``--json``."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rows = {p: summary(measure_precision(p, args.model, args)) for p in args.precisions}
    load = {"before": load_before, "after": os.getloadavg()}
    sys.stdout.write(markdown(rows) + f"load average (1, 5, 15 min): before {load['before']}, after {load['after']}\n")
    if args.json is not None:
        result = {
            "command": "python -m bench.host_overhead " + " ".join(sys.argv[1:] if argv is None else argv),
            "model": args.model,
            "clock": args.clock,
            "machine": machine_info(),
            "load_average": load,
            "precisions": rows,
        }
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
