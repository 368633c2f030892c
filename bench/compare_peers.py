"""CLI: per-step time and host syncs of Halfcast vs a hand-written AMP loop, Accelerate and Fabric.

``python -m bench.compare_peers --steps 200 --rounds 5 --json out.json`` builds every path on
the same workload (:mod:`bench.workload`), warms each up, times them in interleaved
rounds and counts host syncs per steady-state step (:mod:`bench.measure`), then writes
a markdown table to stdout and, with ``--json``, every number to a file. Ratios are
relative to the hand-written loop measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bench.measure import (
    BatchCycle,
    SyncCounts,
    count_syncs,
    interleaved_times,
    median,
    paired_ratios,
    run_steps,
)
from bench.peers import PEERS, NotInstalledError, PeerInfo, Runner, build_runner
from bench.report import machine_info, markdown_table, notes
from bench.workload import Workload, make_batches
from trainer.data import Batch

log = logging.getLogger(__name__)

REFERENCE = "hand"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The CLI's options (see ``--help``)."""
    parser = argparse.ArgumentParser(prog="python -m bench.compare_peers", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps", type=int, default=200, help="steps per path per round (a multiple of --log-interval)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps per path first")
    parser.add_argument("--sync-steps", type=int, default=10, help="steady-state steps whose host syncs are counted")
    parser.add_argument("--precision", choices=("fp16", "bf16"), default="fp16")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated subset of {','.join(PEERS)}")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--batch", type=int, default=64, help="micro-batch size")
    parser.add_argument("--hidden", default="512,512", help="MLP hidden sizes, comma-separated")
    parser.add_argument("--in-features", type=int, default=256)
    parser.add_argument("--log-interval", type=int, default=10, help="Halfcast's steps per telemetry flush")
    parser.add_argument("--compile", action="store_true", help="every path compiles its model with its own option")
    parser.add_argument("--json", type=Path, help="write the full result here")
    return parser.parse_args(argv)


def workload_from(args: argparse.Namespace) -> Workload:
    """The :class:`Workload` of the parsed options; its LR schedule spans every step of the run."""
    total = args.warmup + args.steps * args.rounds + args.sync_steps + 1
    return Workload(
        precision=args.precision,
        in_features=args.in_features,
        hidden_sizes=tuple(int(h) for h in args.hidden.split(",")),
        micro_batch_size=args.batch,
        log_interval=args.log_interval,
        total_steps=total,
        compile=args.compile,
    )


def set_up(
    names: Sequence[str],
    work: Any,
    build: Callable[[str], Runner] | None = None,
) -> tuple[dict[str, Runner], dict[str, dict[str, Any]]]:
    """Runners of the installed peers, and a failed result for each peer that could not be set up.

    ``build(name)`` makes a runner (default: :func:`bench.peers.build_runner` on ``work``);
    ``work`` needs a ``precision``.
    """
    runners: dict[str, Runner] = {}
    missing: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            runners[name] = build(name) if build is not None else build_runner(name, work)
        except NotInstalledError as exc:
            missing[name] = _unavailable(name, work, "not installed", str(exc))
        except Exception as exc:
            log.exception("peer %s could not be set up", name)
            missing[name] = _unavailable(name, work, "failed", f"{type(exc).__name__}: {exc}")
    return runners, missing


def _unavailable(name: str, work: Any, status: str, error: str) -> dict[str, Any]:
    return {"status": status, "error": error, "info": asdict(PeerInfo(label=name, requested=work.precision))}


def run_benchmark(
    work: Workload, names: Sequence[str], *, steps: int, rounds: int, warmup: int, sync_steps: int
) -> dict[str, Any]:
    """Set up, warm up, time and count syncs of the peers ``names`` (``"hand"`` must be one).

    Returns ``{"workload", "machine", "reference", "peers": {name: result}}``; a result holds
    ``status``, ``info`` and, when ``status == "ok"``, ``seconds_per_step`` (one per round),
    ``median_ms``, ``ratio`` / ``ratio_min`` / ``ratio_max`` (per-round ratio to the hand
    loop: median, min, max), ``best_ms`` and ``best_ratio`` (fastest round, and its ratio
    to the hand loop's fastest: the estimate least affected by other load), ``syncs_per_step``, ``steady_syncs``,
    ``syncs_per_flush`` and
    ``flush_interval``. Raises ``ValueError`` without the reference peer.
    """
    if REFERENCE not in names:
        raise ValueError(f"the reference peer {REFERENCE!r} must be measured")
    batches = make_batches(work)
    runners, results = set_up(names, work)
    try:
        results.update(
            measure_runners(
                runners,
                batches,
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
    ordered = {name: results[name] for name in names}
    return {"workload": asdict(work), "machine": machine_info(), "reference": REFERENCE, "peers": ordered}


def measure_runners(
    runners: Mapping[str, Runner],
    batches: Sequence[Batch],
    *,
    steps: int,
    rounds: int,
    warmup: int,
    sync_steps: int,
    flush_interval: int,
) -> dict[str, dict[str, Any]]:
    """Warm up, time in interleaved rounds, then count syncs of every runner (:data:`REFERENCE` among
    them); each on its own cursor over ``batches``. Returns :func:`peer_result` per runner."""
    cycles = {name: BatchCycle(batches) for name in runners}
    for name, runner in runners.items():
        run_steps(runner, cycles[name], warmup)
    times = interleaved_times(runners, cycles, steps, rounds)
    results = {}
    for name, runner in runners.items():
        syncs = count_syncs(runner, cycles[name], sync_steps)
        results[name] = peer_result(runner, times[name], times[REFERENCE], syncs, flush_interval)
    return results


def peer_result(
    runner: Runner, seconds: list[float], reference: list[float], syncs: SyncCounts, flush_interval: int
) -> dict[str, Any]:
    """One path's ``"ok"`` result (see :func:`run_benchmark`) from its per-round times and sync counts."""
    per_step, per_flush = syncs.per_step, syncs.per_flush
    ratios = paired_ratios(seconds, reference)
    return {
        "status": "ok",
        "info": asdict(runner.info),
        "seconds_per_step": seconds,
        "median_ms": median(seconds) * 1e3,
        "ratio": median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "best_ms": min(seconds) * 1e3,
        "best_ratio": min(seconds) / min(reference),
        "syncs_per_step": per_step,
        "steady_syncs": max(per_step, default=0),
        "syncs_per_flush": per_flush,
        "flush_interval": flush_interval,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; the table goes to stdout, progress to the log."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.peers.split(",") if n.strip()]
    result = run_benchmark(
        workload_from(args), names, steps=args.steps, rounds=args.rounds, warmup=args.warmup, sync_steps=args.sync_steps
    )
    result["command"] = "python -m bench.compare_peers " + " ".join(sys.argv[1:] if argv is None else argv)
    sys.stdout.write(markdown_table(result["peers"]) + "\n" + notes(result["peers"]))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
