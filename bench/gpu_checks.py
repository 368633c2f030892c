"""The prepared GPU checks (issue 17 item 5): syncs, tokens/s and MFU per model x precision x path.

On a lent GPU, one command (sized for under 6 minutes on one H100/H200 with the GPU tests, an
estimate from the FLOPs: not yet run on one; ``--quick``: the same sizes, 5 + 15 steps)::

    python -m bench.gpu_checks --json $OUT/gpu.json && python -m pytest -m gpu -q tests/trainer

For each model (``gpt``: :class:`trainer.models.gpt.GPT`, 12 layers x 768, seq 1024, batch 16;
``hf-lora``: a random-init Llama built from its config, 16 layers x 1024, about 200M
parameters, seq 1024, batch 8, PEFT LoRA r 16 on every Linear but the head), each precision
(fp16, bf16, fp8: torchao on compute capability >= 8.9, else ``skipped`` with the reason) and
each path (``halfcast``: :func:`trainer.run.step.train_step` on ``build_components``; ``hand``: a
plain ``torch.autocast`` + ``torch.amp.GradScaler`` + fused AdamW loop on the same model and
batches, :mod:`bench.gpu.hand_path`), it takes warm-up steps, then times the steady steps:

* Halfcast's run under ``torch.cuda.set_sync_debug_mode("error")`` (any synchronising call
  raises and fails the row; its telemetry flush every ``log_interval`` steps runs outside it);
  the hand loop's syncs are counted (``"warn"``), not refused (:mod:`bench.gpu.syncs`);
* ``tokens_per_s`` (input tokens / wall seconds, flushes included) and ``mfu`` against
  ``--peak-flops`` (default 989e12, the dense bf16 peak of an H100/H200 SXM; fp8 divided by the
  same peak), FLOPs per token as in :mod:`bench.gpu.flops` (PaLM's ``6N + 12 L T d``; LoRA
  ``4N + 2 N_trainable + 12 L T d``);
* ``comparisons``: Halfcast / hand tokens/s per model x precision;
* ``ddp``: the same checks under NCCL DDP, one process per GPU, when there is more than one
  GPU (per-rank rows, total tokens/s); ``skipped: one GPU`` otherwise (:mod:`bench.gpu.ddp`);
* ``targets``: bf16 MFU >= 0.45 on GPT, fp8 >= 1.2x bf16 tokens/s, as pass/fail fields.

Output: the JSON summary (:class:`bench.gpu.results.Summary`) on stdout, to ``--json PATH``,
and to ``$OUT/gpu_checks.json`` when ``OUT`` is set. Exit status 1 when a row failed (a sync,
an error, a non-finite loss), 2 without CUDA (and no ``--dry-run``), else 0: a missed target is
not a failure. ``--dry-run`` runs every path on the CPU with tiny models for one steady step
(syncs counted with :class:`trainer.sync_counter.HostSyncCounter`, DDP on two gloo processes,
fp8 skipped): a smoke test of the script, no numbers worth reading.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from bench.gpu.ddp import run_ddp
from bench.gpu.matrix import run_matrix
from bench.gpu.results import Comparison, PathResult, RowStatus, Summary
from bench.gpu.settings import (
    DRY_RUN,
    QUICK_COUNTS,
    CheckPrecision,
    CheckSettings,
    GptSize,
    LlamaSize,
    ModelKind,
    PathKind,
    StepCounts,
)
from bench.gpu.targets import evaluate_targets
from trainer.parallel.distributed import DistContext

log = logging.getLogger(__name__)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The script's options (see ``--help``)."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_checks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt,hf-lora")
    parser.add_argument("--precisions", default="fp16,bf16,fp8")
    parser.add_argument("--paths", default="halfcast,hand")
    parser.add_argument("--implementation", default="fused", help="Halfcast's AdamW implementation (fused, foreach)")
    gpt = GptSize()
    parser.add_argument("--gpt", default=f"{gpt.n_layer}x{gpt.n_head}x{gpt.d_model}", help="n_layer x n_head x d_model")
    llama = LlamaSize()
    parser.add_argument(
        "--llama",
        default=f"{llama.num_layers}x{llama.num_heads}x{llama.hidden_size}x{llama.intermediate_size}",
        help="layers x heads x hidden x intermediate",
    )
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--gpt-batch", type=int, default=gpt.batch, help="GPT sequences per step")
    parser.add_argument("--llama-batch", type=int, default=llama.batch, help="Llama sequences per step")
    parser.add_argument("--lora-r", type=int, default=llama.lora_r)
    parser.add_argument("--warmup", type=int, default=StepCounts().warmup)
    parser.add_argument("--steps", type=int, default=StepCounts().steps, help="steady-state steps checked and timed")
    parser.add_argument("--log-interval", type=int, default=StepCounts().log_interval)
    parser.add_argument(
        "--peak-flops", type=float, default=CheckSettings().peak_flops, help="the GPU's dense bf16 peak, FLOP/s"
    )
    parser.add_argument("--quick", action="store_true", help="the same sizes, fewer steps")
    parser.add_argument("--no-ddp", action="store_true", help="skip the DDP checks even with several GPUs")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="both paths compiled: Halfcast compile: true (model and step), the hand loop torch.compile(model)",
    )
    parser.add_argument("--json", type=Path, help="also write the summary here")
    parser.add_argument("--dry-run", action="store_true", help="tiny models on the CPU, one steady step")
    return parser.parse_args(argv)


def _dims(text: str, count: int) -> list[int]:
    values = [int(v) for v in text.lower().split("x")]
    if len(values) != count:
        raise SystemExit(f"expected {count} sizes joined by 'x', got {text!r}")
    return values


def settings_from(args: argparse.Namespace) -> CheckSettings:
    """The typed :class:`CheckSettings` of the command line."""
    n_layer, n_head, d_model = _dims(args.gpt, 3)
    layers, heads, hidden, intermediate = _dims(args.llama, 4)
    fields: dict[str, object] = {
        "models": tuple(ModelKind(m) for m in args.models.split(",")),
        "precisions": tuple(CheckPrecision(p) for p in args.precisions.split(",")),
        "paths": tuple(PathKind(p) for p in args.paths.split(",")),
        "gpt": GptSize(n_layer=n_layer, n_head=n_head, d_model=d_model, seq_len=args.seq_len, batch=args.gpt_batch),
        "llama": LlamaSize(
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_layers=layers,
            num_heads=heads,
            seq_len=args.seq_len,
            batch=args.llama_batch,
            lora_r=args.lora_r,
            lora_alpha=2 * args.lora_r,
        ),
        "counts": QUICK_COUNTS
        if args.quick
        else StepCounts(warmup=args.warmup, steps=args.steps, log_interval=args.log_interval),
        "implementation": args.implementation,
        "peak_flops": args.peak_flops,
        "dry_run": args.dry_run,
        "ddp": not args.no_ddp,
        "compile": args.compile,
    }
    if args.dry_run:
        fields |= DRY_RUN
    return CheckSettings.model_validate(fields)


def compare(rows: list[PathResult]) -> list[Comparison]:
    """Halfcast / hand tokens/s for every model x precision that has both rows."""
    by_key = {(r.model, r.precision, r.path): r for r in rows}
    comparisons = []
    for model, precision in dict.fromkeys((r.model, r.precision) for r in rows):
        ours, hand = by_key.get((model, precision, PathKind.HALFCAST)), by_key.get((model, precision, PathKind.HAND))
        if ours is None or hand is None:
            continue
        a, b = ours.tokens_per_s, hand.tokens_per_s
        comparisons.append(
            Comparison(
                model=model,
                precision=precision,
                halfcast_tokens_per_s=a,
                hand_tokens_per_s=b,
                ratio=a / b if a is not None and b else None,
            )
        )
    return comparisons


def run_checks(settings: CheckSettings) -> Summary:
    """The single-device matrix, then DDP, comparisons and targets."""
    device = torch.device("cpu") if settings.dry_run else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    rows = run_matrix(settings, DistContext(rank=0, local_rank=0, world_size=1, device=device))
    ddp = run_ddp(settings)
    failed = any(r.status is RowStatus.FAILED for r in rows) or ddp.status is RowStatus.FAILED
    return Summary(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)",
        gpus=torch.cuda.device_count() if device.type == "cuda" else 0,
        torch=torch.__version__,
        dry_run=settings.dry_run,
        peak_flops=settings.peak_flops,
        settings=settings.model_dump(mode="json"),
        results=rows,
        comparisons=compare(rows),
        ddp=ddp,
        targets=evaluate_targets(rows, settings.dry_run),
        all_ok=not failed,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks, print the JSON summary, write it to ``--json`` and ``$OUT/gpu_checks.json``."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        log.error("no CUDA device: run with --dry-run on a CPU")
        return 2
    summary = run_checks(settings_from(args))
    text = summary.model_dump_json(indent=2)
    sys.stdout.write(text + "\n")
    destinations = [args.json] if args.json else []
    if os.environ.get("OUT"):
        destinations.append(Path(os.environ["OUT"], "gpu_checks.json"))
    for path in destinations:
        path.write_text(text)
    return 0 if summary.all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
