"""Issue 17's throughput targets, evaluated on Halfcast's rows as pass/fail fields (never exit failures)."""

from __future__ import annotations

from bench.gpu.results import PathResult, Target
from bench.gpu.settings import CheckPrecision, ModelKind, PathKind

#: bf16 MFU of Halfcast's step on the GPT-style model.
BF16_MFU_TARGET = 0.45
#: fp8 tokens/s over bf16 tokens/s of Halfcast's step.
FP8_SPEEDUP_TARGET = 1.2


def _halfcast(rows: list[PathResult], model: ModelKind, precision: CheckPrecision) -> PathResult | None:
    return next((r for r in rows if (r.model, r.precision, r.path) == (model, precision, PathKind.HALFCAST)), None)


def _target(name: str, value: float | None, threshold: float, note: str, dry_run: bool) -> Target:
    if dry_run:
        return Target(name=name, value=value, threshold=threshold, passed=None, note="dry run: not evaluated")
    passed = None if value is None else value >= threshold
    return Target(name=name, value=value, threshold=threshold, passed=passed, note=note if value is None else "")


def evaluate_targets(rows: list[PathResult], dry_run: bool) -> list[Target]:
    """bf16 MFU >= 0.45 on GPT; fp8 >= 1.2x bf16 tokens/s on GPT (and, for reference, on the LoRA model)."""
    targets = []
    gpt_bf16 = _halfcast(rows, ModelKind.GPT, CheckPrecision.BF16)
    mfu = (
        gpt_bf16.measured.mfu
        if gpt_bf16 is not None and gpt_bf16.tokens_per_s is not None and gpt_bf16.measured
        else None
    )
    targets.append(_target("gpt_bf16_mfu", mfu, BF16_MFU_TARGET, "no ok gpt/bf16 Halfcast row", dry_run))
    for model in (ModelKind.GPT, ModelKind.HF_LORA):
        fp8, bf16 = _halfcast(rows, model, CheckPrecision.FP8), _halfcast(rows, model, CheckPrecision.BF16)
        fast, base = (fp8.tokens_per_s if fp8 else None), (bf16.tokens_per_s if bf16 else None)
        ratio = fast / base if fast is not None and base else None
        note = f"no ok {model} fp8 and bf16 Halfcast rows (fp8: {fp8.reason if fp8 else 'not run'})"
        targets.append(_target(f"{model}_fp8_over_bf16_tokens_per_s", ratio, FP8_SPEEDUP_TARGET, note, dry_run))
    return targets
