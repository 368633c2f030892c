"""``bench.gpu_checks --dry-run`` (issue 17 item 5): every path of the prepared GPU script runs on the CPU.

One in-process ``main(["--dry-run", "--no-ddp", "--json", ...])`` over the whole matrix (tiny models,
one steady step, ~9 s) writes the JSON the shape checks share: every model x precision x
{halfcast, hand} is present, ``ok`` with its measurements or ``skipped`` with a reason (fp8 has no
GPU here); the ratios, targets and DDP report have their fields. A second dry run spawns the
two-rank gloo DDP on the GPT model in bf16 (~13 s on a loaded 2-core VM, mostly the ranks' imports).
"""

from __future__ import annotations

import itertools
import json

import pytest

from bench.gpu.ddp import run_ddp
from bench.gpu.results import RowStatus, Summary
from bench.gpu.settings import CheckPrecision, ModelKind, PathKind
from bench.gpu_checks import main, parse_args, settings_from

pytestmark = pytest.mark.slow  # spawns gloo ranks and imports transformers: not in make check

ALL_ROWS = set(itertools.product(ModelKind, CheckPrecision, PathKind))


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> Summary:
    out = tmp_path_factory.mktemp("gpu-checks") / "gpu.json"
    assert main(["--dry-run", "--no-ddp", "--json", str(out)]) == 0
    return Summary.model_validate(json.loads(out.read_text()))


def test_every_model_precision_and_path_is_reported(summary: Summary) -> None:
    assert {(r.model, r.precision, r.path) for r in summary.results} == ALL_ROWS
    assert summary.all_ok and summary.dry_run
    for row in summary.results:
        if row.precision is CheckPrecision.FP8:  # no GPU: skipped, saying why
            assert row.status is RowStatus.SKIPPED and row.reason and "fp8" in row.reason
            continue
        assert row.status is RowStatus.OK, row.reason
        measured = row.measured
        assert measured is not None and measured.tokens_per_s > 0 and measured.mfu > 0
        assert measured.syncs_per_step is not None and len(measured.syncs_per_step) == 1
        if row.path is PathKind.HALFCAST:
            assert measured.syncs_per_step == [0]


def test_lora_counts_adapter_weight_gradients_only(summary: Summary) -> None:
    """FLOPs per token: 6N for the GPT, 4N + 2 N_adapters (+ attention) for the LoRA model."""
    for row in summary.results:
        if row.measured is None:
            continue
        m = row.measured
        attention = m.flops_per_token - 4 * m.matmul_params - 2 * m.trainable_matmul_params
        assert attention > 0
        if row.model is ModelKind.GPT:
            assert m.trainable_matmul_params == m.matmul_params
        else:
            assert 0 < m.trainable_matmul_params < m.matmul_params / 4


def test_ratios_targets_and_ddp_fields(summary: Summary) -> None:
    pairs = {(c.model, c.precision): c for c in summary.comparisons}
    assert set(pairs) == set(itertools.product(ModelKind, CheckPrecision))
    assert all(c.ratio is None for (_, p), c in pairs.items() if p is CheckPrecision.FP8)
    assert all(c.ratio and c.ratio > 0 for (_, p), c in pairs.items() if p is not CheckPrecision.FP8)
    names = {t.name for t in summary.targets}
    assert {"gpt_bf16_mfu", "gpt_fp8_over_bf16_tokens_per_s"} <= names
    assert all(t.passed is None for t in summary.targets)  # a dry run evaluates no target
    assert summary.ddp.status is RowStatus.SKIPPED and summary.ddp.reason


def test_ddp_dry_run_spawns_two_gloo_ranks() -> None:
    report = run_ddp(settings_from(parse_args(["--dry-run", "--models", "gpt", "--precisions", "bf16"])))
    assert report.status is RowStatus.OK and report.backend == "gloo" and report.world_size == 2
    assert sorted((r.rank, r.path) for r in report.results) == [
        (0, PathKind.HALFCAST),
        (0, PathKind.HAND),
        (1, PathKind.HALFCAST),
        (1, PathKind.HAND),
    ]
    assert all(r.status is RowStatus.OK and r.world_size == 2 for r in report.results)
    halfcast = [r.measured for r in report.results if r.path is PathKind.HALFCAST]
    assert all(m is not None and m.syncs_per_step == [0] for m in halfcast)
    assert set(report.total_tokens_per_s) == {"gpt/bf16/halfcast", "gpt/bf16/hand"}
