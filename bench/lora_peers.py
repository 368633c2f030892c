"""CLI: a LoRA fine-tuning step of Halfcast vs a hand-written PEFT + torch.amp loop and HF Trainer.

``python -m bench.lora_peers --precision bf16 --steps 20 --rounds 15 --warmup 10 --json out.json``
writes one tiny random-init Llama into a temporary model root (:mod:`bench.lora_workload`),
builds every path on it (:mod:`bench.lora`), warms each up, times them in interleaved
rounds and counts host syncs per steady-state step (:func:`bench.compare_peers.measure_runners`),
then measures each path's peak memory in a fresh process of its own (:mod:`bench.lora_memory`).
The table goes to stdout, every number to ``--json``. Ratios are to the hand loop of the same run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bench.compare_peers import REFERENCE, measure_runners, set_up
from bench.lora import LORA_PEERS, build_lora_runner
from bench.lora_memory import measure_in_subprocess
from bench.lora_workload import LoraWorkload, make_batches, save_model
from bench.report import Column, machine_info, markdown_table, notes

log = logging.getLogger(__name__)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The CLI's options (see ``--help``)."""
    parser = argparse.ArgumentParser(prog="python -m bench.lora_peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16")
    parser.add_argument("--steps", type=int, default=20, help="steps per path per round")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps per path first")
    parser.add_argument("--sync-steps", type=int, default=10, help="steady-state steps whose host syncs are counted")
    parser.add_argument(
        "--memory-steps", type=int, default=5, help="steps per path in its peak-memory process (0: skip)"
    )
    parser.add_argument(
        "--peers", default=",".join(LORA_PEERS), help=f"comma-separated subset of {','.join(LORA_PEERS)}"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--batch", type=int, default=8, help="micro-batch size (sequences)")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--log-interval", type=int, default=10, help="Halfcast's steps per telemetry flush")
    parser.add_argument("--compile", action="store_true", help="every path compiles its model with its own option")
    parser.add_argument("--json", type=Path, help="write the full result here")
    return parser.parse_args(argv)


def workload_from(args: argparse.Namespace) -> LoraWorkload:
    """The :class:`LoraWorkload` of the parsed options; its LR schedule spans every step of the run."""
    total = args.warmup + args.steps * args.rounds + args.sync_steps + 10
    return LoraWorkload(
        precision=args.precision,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_layers=args.layers,
        vocab_size=args.vocab,
        seq_len=args.seq_len,
        micro_batch_size=args.batch,
        total_steps=total,
        log_interval=args.log_interval,
        compile=args.compile,
    )


def run_lora_benchmark(
    work: LoraWorkload,
    names: Sequence[str],
    *,
    steps: int,
    rounds: int,
    warmup: int,
    sync_steps: int,
    memory_steps: int = 0,
    threads: int = 1,
) -> dict[str, Any]:
    """Time, count syncs of and (``memory_steps > 0``) measure the peak memory of the paths ``names``.

    Returns ``{"workload", "machine", "load_average", "reference", "peers"}``; each peer's result is
    :func:`bench.compare_peers.peer_result`'s plus ``"memory"`` (:mod:`bench.lora_memory`) when measured.
    Raises ``ValueError`` without the reference path ``"hand"``.
    """
    if REFERENCE not in names:
        raise ValueError(f"the reference path {REFERENCE!r} must be measured")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="halfcast-bench-lora-") as tmp:
        root = Path(tmp)
        save_model(work, root)
        runners, results = set_up(names, work, partial(_build, work=work, root=root))
        try:
            results.update(
                measure_runners(
                    runners,
                    make_batches(work),
                    steps=steps,
                    rounds=rounds,
                    warmup=warmup,
                    sync_steps=sync_steps,
                    flush_interval=work.log_interval,
                )
            )
        finally:
            for runner in runners.values():
                runner.close()
    if memory_steps > 0:
        for name in runners:
            results[name]["memory"] = measure_in_subprocess(name, work, memory_steps, threads)
    return {
        "workload": asdict(work),
        "machine": machine_info(),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "reference": REFERENCE,
        "peers": {name: results[name] for name in names},
    }


def _build(name: str, *, work: LoraWorkload, root: Path) -> Any:
    return build_lora_runner(name, work, root)


def _peak_cell(result: Mapping[str, Any]) -> str:
    memory = result.get("memory")
    if not memory:
        return "—"
    return f"{memory['peak_mib']:.1f}" if "peak_mib" in memory else f"error: {memory['error']}"


#: The LoRA table's extra column.
PEAK_COLUMN: Column = ("peak RSS Δ MiB (own process)", _peak_cell)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; the table goes to stdout, progress to the log."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.peers.split(",") if n.strip()]
    result = run_lora_benchmark(
        workload_from(args),
        names,
        steps=args.steps,
        rounds=args.rounds,
        warmup=args.warmup,
        sync_steps=args.sync_steps,
        memory_steps=args.memory_steps,
        threads=args.threads,
    )
    result["command"] = "python -m bench.lora_peers " + " ".join(sys.argv[1:] if argv is None else argv)
    load = result["load_average"]
    sys.stdout.write(
        markdown_table(result["peers"], [PEAK_COLUMN])
        + "\n"
        + notes(result["peers"])
        + f"load average (1, 5, 15 min): before {load['before']}, after {load['after']}\n"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
