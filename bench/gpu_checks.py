"""One prepared CUDA check (single GPU): zero host syncs per steady-state step, tokens/s and MFU per precision.

For each precision (fp16, bf16, fp8) and optimizer implementation (fused AdamW by
default, ``foreach`` optionally) this script builds Halfcast's components for a GPT-style
model (:class:`trainer.models.gpt.GPT`) on byte-level text, takes warm-up steps, then
runs the steady-state steps with ``torch.cuda.set_sync_debug_mode("error")`` active
around every step (any synchronising call raises; the telemetry flush every
``log_interval`` steps runs outside it, as it is the loop's one intended copy). It reports:

* ``tokens_per_s``: input tokens of the steady-state steps / wall seconds (flushes
  included; ``torch.cuda.synchronize`` before and after);
* ``mfu``: model FLOPs utilisation ``6 * N * tokens_per_s / peak_flops`` (Kaplan et al.,
  "Scaling Laws for Neural Language Models", arXiv:2001.08361, section 2.1; PaLM,
  arXiv:2204.02311, appendix B), with ``N`` the trainable parameters (tied embeddings
  once). The attention term ``12 * n_layer * seq_len * d_model`` is left out, so MFU is
  slightly understated. ``--peak-flops`` defaults to 989e12, the dense bf16 peak of an
  H100/H200 SXM; fp8 is divided by the same bf16 peak (say so when comparing).

fp8 runs through the trainer's fp8 path (torchao on compute capability >= 8.9); without
torchao or such a GPU it is reported ``skipped`` with the trainer's reason.

Output: a JSON summary on stdout, also written to ``$OUT/gpu_checks.json`` when ``OUT`` is
set. Exit status 1 when a check failed (a sync, an error, a non-finite loss), else 0.
``--dry-run`` builds everything on the CPU with a tiny model for one steady-state step,
counting syncs with :class:`trainer.sync_counter.HostSyncCounter` instead (a smoke test of
the script itself, no numbers worth reading).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from trainer.components import Components, build_components
from trainer.distributed import DistContext
from trainer.optim import resolve_implementation
from trainer.precision import PrecisionUnsupportedError
from trainer.spec import JobSpec
from trainer.step import record_step, train_step
from trainer.sync_counter import HostSyncCounter
from trainer.telemetry import StepLog, StepRow

log = logging.getLogger(__name__)

#: Dense bf16 peak of an H100/H200 SXM, FLOP/s (NVIDIA datasheet, without sparsity).
H100_BF16_PEAK = 989e12


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The script's options (see ``--help``)."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_checks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--precisions", default="fp16,bf16,fp8")
    parser.add_argument("--implementations", default="fused", help="AdamW implementations, e.g. fused,foreach")
    parser.add_argument("--n-layer", type=int, default=12)
    parser.add_argument("--n-head", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=16, help="sequences per step")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40, help="steady-state steps checked and timed")
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--max-bytes", type=int, default=8 << 20, help="text bytes to load")
    parser.add_argument("--peak-flops", type=float, default=H100_BF16_PEAK, help="the GPU's dense bf16 peak, FLOP/s")
    parser.add_argument("--dry-run", action="store_true", help="tiny model on the CPU, one steady step")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.n_layer, args.n_head, args.d_model, args.seq_len, args.batch = 1, 2, 32, 16, 2
        args.warmup, args.steps, args.log_interval, args.max_bytes = 2, 1, 1, 20_000
    return args


def job_spec(args: argparse.Namespace, precision: str, implementation: str) -> JobSpec:
    """A GPT-on-text job for one precision and AdamW implementation (one GPU, or CPU with ``--dry-run``)."""
    return JobSpec.model_validate(
        {
            "model": {
                "name": "gpt",
                "config": {"n_layer": args.n_layer, "n_head": args.n_head, "d_model": args.d_model},
            },
            "dataset": {
                "name": "text",
                "config": {"seq_len": args.seq_len, "max_bytes": args.max_bytes, "test_fraction": 0.05},
            },
            "precision": precision,
            "gpus": 0 if args.dry_run else 1,
            "micro_batch_size": args.batch,
            "max_steps": args.warmup + args.steps,
            "log_interval": args.log_interval,
            "max_grad_norm": 1.0,
            "optimizer": {"name": "adamw", "lr": 3e-4, "weight_decay": 0.1, "implementation": implementation},
            "lr_scheduler": {"name": "cosine", "warmup_steps": 2},
        }
    )


def preload(parts: Components, spec: JobSpec, device: torch.device, count: int = 8) -> list[Any]:
    """``count`` micro-batches already on ``device`` (input loading is not what is measured)."""
    stream = parts.dataset.train_batches(spec.micro_batch_size, rank=0, world_size=1, seed=spec.seed)
    return [batch.to(device) for batch in islice(stream, count)]


@contextmanager
def cuda_sync_errors() -> Iterator[None]:
    """Make any host-synchronising CUDA call raise while active."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


class SyncGuard:
    """Per steady step: CUDA's sync debug mode on a GPU, else a :class:`HostSyncCounter` (dry run)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.counts: list[int] = []

    def around_step(self) -> AbstractContextManager[Any]:
        """The context for one steady-state step."""
        return cuda_sync_errors() if self.cuda else self._counted()

    @contextmanager
    def _counted(self) -> Iterator[None]:
        with HostSyncCounter() as counter:
            yield
        self.counts.append(counter.total)

    @property
    def method(self) -> str:
        """How syncs were checked."""
        return 'torch.cuda.set_sync_debug_mode("error")' if self.cuda else "HostSyncCounter (CPU dry run)"


def run_steps(
    parts: Components,
    batches: list[Any],
    step_log: StepLog,
    ctx: DistContext,
    first: int,
    count: int,
    guard: SyncGuard | None,
) -> list[StepRow]:
    """Steps ``first .. first + count - 1``, each inside ``guard`` when given; the rows drained when the log filled."""
    rows: list[StepRow] = []
    for step in range(first, first + count):
        batch = batches[step % len(batches)]
        with guard.around_step() if guard is not None else _nothing():
            result = train_step(parts, [batch], step=step, max_grad_norm=1.0, dist_ctx=ctx)
            record_step(step_log, step, result)
        if step_log.full:
            rows += step_log.drain()
    return rows


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def synchronize(device: torch.device) -> None:
    """Wait for the device (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_one(args: argparse.Namespace, precision: str, implementation: str, ctx: DistContext) -> dict[str, Any]:
    """Build, warm up, then check and time the steady-state steps of one configuration."""
    row: dict[str, Any] = {"precision": precision, "implementation": implementation}
    try:
        spec = job_spec(args, precision, implementation)
        parts = build_components(spec, ctx)
    except PrecisionUnsupportedError as exc:
        return row | {"status": "skipped", "reason": str(exc)}
    except ValidationError as exc:  # the spec refuses fp8 without a GPU (dry run)
        return row | {"status": "skipped", "reason": exc.errors()[0]["msg"]}
    batches = preload(parts, spec, ctx.device)
    step_log = StepLog(args.log_interval, ctx.device)
    run_steps(parts, batches, step_log, ctx, 1, args.warmup, guard=None)
    step_log.drain()
    guard = SyncGuard(ctx.device)
    synchronize(ctx.device)
    start = time.perf_counter()
    rows = run_steps(parts, batches, step_log, ctx, args.warmup + 1, args.steps, guard)
    rows += step_log.drain()
    synchronize(ctx.device)
    seconds = time.perf_counter() - start
    return row | measurements(args, parts, spec, seconds, guard, rows)


def measurements(
    args: argparse.Namespace, parts: Components, spec: JobSpec, seconds: float, guard: SyncGuard, rows: list[StepRow]
) -> dict[str, Any]:
    """Throughput, MFU, sync check and sanity of the last rows of one configuration."""
    params = sum(p.numel() for p in parts.parameters)
    tokens_per_s = args.steps * spec.micro_batch_size * args.seq_len / seconds
    last_loss = rows[-1].loss if rows else float("nan")
    ok = math.isfinite(last_loss) and all(c == 0 for c in guard.counts)
    return {
        "status": "ok" if ok else "failed",
        # parts.parameters holds Parameters typed as Tensor (trainer.optim asks for Parameter)
        "optimizer": f"AdamW({resolve_implementation(spec.optimizer.implementation, parts.parameters)})",  # type: ignore[arg-type]
        "fp8_layers": len(parts.precision.fp8_layers),
        "sync_check": guard.method,
        "syncs_per_step": guard.counts or None,
        "steady_steps": args.steps,
        "step_ms": 1e3 * seconds / args.steps,
        "tokens_per_s": tokens_per_s,
        "params": params,
        "mfu": 6 * params * tokens_per_s / args.peak_flops,
        "last_loss": last_loss,
        "skipped_steps": int(parts.precision.skipped_steps.item()),
    }


def run_checks(args: argparse.Namespace) -> dict[str, Any]:
    """Every precision x implementation; a sync inside a steady step fails that row (the error is kept)."""
    device = torch.device("cpu") if args.dry_run else torch.device("cuda", 0)
    ctx = DistContext(rank=0, local_rank=0, world_size=1, device=device)
    results = []
    for precision in args.precisions.split(","):
        for implementation in args.implementations.split(","):
            try:
                results.append(check_one(args, precision, implementation, ctx))
            except RuntimeError as exc:  # the sync debug mode raises RuntimeError naming the call
                log.exception("%s/%s failed", precision, implementation)
                results.append(
                    {
                        "precision": precision,
                        "implementation": implementation,
                        "status": "failed",
                        "reason": f"{type(exc).__name__}: {exc}",
                    }
                )
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)",
        "torch": torch.__version__,
        "dry_run": args.dry_run,
        "peak_flops": args.peak_flops,
        "model": {
            "n_layer": args.n_layer,
            "n_head": args.n_head,
            "d_model": args.d_model,
            "seq_len": args.seq_len,
            "batch": args.batch,
        },
        "results": results,
        "all_ok": all(r["status"] in ("ok", "skipped") for r in results),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks, print the JSON summary, write ``$OUT/gpu_checks.json`` if ``OUT`` is set."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        log.error("no CUDA device: run with --dry-run on a CPU")
        return 2
    summary = run_checks(args)
    text = json.dumps(summary, indent=2)
    sys.stdout.write(text + "\n")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_checks.json").write_text(text)
    return 0 if summary["all_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
