"""Step records gathered on the device and written in batches: still one record per attempted step."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_support import json_records

from halfcast.contracts.spec import JobSpec
from trainer.parallel.distributed import DistContext
from trainer.records import RecordSink
from trainer.run.flushing import RecordFlusher, RunTotals
from trainer.run.loop import train
from trainer.run.telemetry import FIELDS, StepLog, StepMetrics

CPU = torch.device("cpu")


def _values(loss: float, kind: float, skipped: int, samples: int, tokens: int) -> StepMetrics:
    """A row's values for a step of ``kind`` (0 clean, 1 infinities, 2 NaN): the flag, and the norm that tells the kind."""
    return StepMetrics(
        loss=torch.tensor(loss),
        loss_scale=torch.tensor(1024.0),
        overflow=torch.tensor(1.0 if kind else 0.0),
        skipped_steps=torch.tensor(skipped),
        grad_norm=torch.tensor({0.0: 0.5, 1.0: float("inf"), 2.0: float("nan")}[kind]),
        lr=torch.tensor(0.1, dtype=torch.float64),
        samples=torch.tensor(samples),
        tokens=torch.tensor(tokens),
        underflow_fraction=torch.tensor(float("nan") if kind else 0.125),
    )


def test_rows_round_trip_exactly_and_the_log_is_bounded() -> None:
    log = StepLog(2, CPU)
    log.record(7, _values(0.25, 0.0, 0, 64, 2**40 + 1), has_tokens=True)
    log.record(8, _values(float("inf"), 2.0, 1, 64, 0), has_tokens=False)
    assert log.full and len(FIELDS) == 9
    with pytest.raises(RuntimeError, match="full"):
        log.record(9, _values(0.0, 0.0, 1, 1, 1), has_tokens=False)
    first, second = log.drain()
    assert (first.step, first.loss, first.loss_scale, first.lr, first.tokens) == (7, 0.25, 1024.0, 0.1, 2**40 + 1)
    assert not first.overflow and first.grad_norm == 0.5 and first.underflow_fraction == 0.125
    assert math.isnan(second.underflow_fraction) and first.rank_kinds == () and first.param_kinds == ()
    assert second.overflow and second.nan and second.tokens is None and second.skipped_steps == 1
    assert log.pending == 0 and log.drain() == []
    with pytest.raises(ValueError):
        too_short: Any = _values(0.0, 0.0, 0, 1, 1)[:3]  # deliberately not a whole set of values
        log.record(1, too_short, has_tokens=False)


def test_rows_carry_the_overflow_evidence_of_every_rank_and_parameter() -> None:
    log = StepLog(2, CPU, num_ranks=2, num_params=3)
    log.record(1, _values(0.5, 0.0, 0, 8, 8), has_tokens=False, evidence=(torch.zeros(2), torch.zeros(3)))
    log.record(
        2,
        _values(0.5, 2.0, 1, 8, 8),
        has_tokens=False,
        evidence=(torch.tensor([0.0, 2.0]), torch.tensor([1.0, 0.0, 2.0])),
    )
    clean, overflow = log.drain()
    assert clean.rank_kinds == (0.0, 0.0) and clean.param_kinds == (0.0, 0.0, 0.0)
    assert overflow.rank_kinds == (0.0, 2.0) and overflow.param_kinds == (1.0, 0.0, 2.0)
    with pytest.raises(ValueError, match="evidence"):
        log.record(3, _values(0.5, 0.0, 0, 8, 8), has_tokens=False, evidence=(torch.zeros(1), torch.zeros(3)))


@pytest.mark.parametrize(
    ("kind", "norms", "param_kinds"),
    [
        (0.0, [0.5, 3.0, 1.0], (0.0, 0.0, 0.0)),
        (1.0, [0.5, float("inf"), 2.0], (0.0, 1.0, 0.0)),
        (2.0, [float("nan"), float("inf"), 1.0], (2.0, 1.0, 0.0)),
    ],
)
def test_one_process_rows_keep_the_gradient_norms_and_the_host_tells_the_kinds(
    kind: float, norms: list[float], param_kinds: tuple[float, ...]
) -> None:
    """One process: the row holds the overflow flag and the per-parameter gradient norms (no device op makes
    kinds); read back, the kinds are the norms' (NaN 2, infinite 1, else 0: a norm of exactly 1.0 or 2.0 is
    finite) and the one rank's kind is the step's, told from the flag and the global norm."""
    log = StepLog(1, CPU, num_ranks=1, num_params=3)
    assert log.evidence_widths == [3]
    log.record(1, _values(0.5, kind, int(kind > 0), 8, 8), has_tokens=False, evidence=(torch.tensor(norms),))
    (row,) = log.drain()
    assert row.overflow_kind == kind and row.rank_kinds == (kind,) and row.param_kinds == param_kinds
    assert row.nan == (kind == 2.0) and row.overflow == (kind > 0)


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The steps of each ``RecordSink.steps`` call (one call per flush), in order."""
    written: list[list[int]] = []
    original = RecordSink.steps

    def spy(self: RecordSink, records: Any) -> None:
        items = list(records)
        written.append([record.step for _, record in items])
        original(self, items)

    monkeypatch.setattr(RecordSink, "steps", spy)
    return written


def test_records_are_batched_at_log_interval_one_per_step(
    tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext, tmp_path: Path, batches: list[list[int]]
) -> None:
    """log_interval 3, eval at 5, 8 steps: batches after steps 1 (the first step ends the start-up), 3, 5
    (before the eval record), 6 (a multiple of 3), 8 (the end); the step records are exactly steps 1..8 in order."""
    spec = tiny_mlp_spec(
        precision="fp16",
        max_steps=8,
        log_interval=3,
        eval_interval=5,
        log_interval_s=None,
        faults={"nonfinite_grad_steps": [2]},
    )
    train(spec, tmp_path, cpu_ctx)
    assert batches == [[1], [2, 3], [4, 5], [6], [7, 8]]

    records = [r for r in json_records(tmp_path) if r["type"] != "phase"]  # start-up phases: test_startup.py
    kinds = [(r["type"], r.get("step")) for r in records]
    assert kinds == [("start", None)] + [("step", s) for s in range(1, 6)] + [("eval", 5)] + [
        ("step", s) for s in range(6, 9)
    ] + [("eval", 8), ("end", None)]
    steps = [r for r in records if r["type"] == "step"]
    assert [s["overflow"] for s in steps] == [False, True] + [False] * 6
    assert [s["skipped_steps"] for s in steps] == [0] + [1] * 7
    assert steps[1]["grad_norm"] is None and all(s["grad_norm"] > 0 for s in steps if not s["overflow"])
    for batch in batches:
        rates = {s["samples_per_second"] for s in steps if s["step"] in batch}
        assert len(rates) == 1 and next(iter(rates)) > 0
    assert all(a["time"] <= b["time"] for a, b in itertools.pairwise(steps))
    assert records[0]["log_interval"] == 3


def test_a_flush_writes_and_returns_the_rows_to_check_it_checks_nothing(tmp_path: Path) -> None:
    """Flushing and the divergence check are two steps: ``flush`` hands back every row written since the
    last flush (those a stale flush wrote first), for the loop to give its guard; ``RunTotals`` count on."""
    log = StepLog(4, CPU)
    with RecordSink(tmp_path / "records.jsonl") as sink:
        flusher = RecordFlusher(log, sink, max_steps=9, main=True, max_latency_s=0.0, totals=RunTotals(100, 7))
        log.record(1, _values(0.5, 0.0, 0, 8, 8), has_tokens=True)
        flusher.flush_if_stale()  # rank 0 writes it early
        log.record(2, _values(float("nan"), 1.0, 1, 8, 8), has_tokens=True)
        rows = flusher.flush()
        assert [r.step for r in rows] == [1, 2] and rows[1].overflow  # a NaN loss, yet nothing raised
        assert flusher.flush() == [] and flusher.skipped_steps == 1
    assert (flusher.totals.samples, flusher.totals.tokens) == (116, 23)
    assert flusher.totals.as_counters() == {"samples_total": 116, "tokens_total": 23}
    assert RunTotals.from_counters({"samples_total": 116, "tokens_total": 23}) == flusher.totals
    assert [r["samples_total"] for r in json_records(tmp_path) if r["type"] == "step"] == [108, 116]


def test_slow_steps_are_written_once_the_oldest_waited_log_interval_s(
    tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext, tmp_path: Path, batches: list[list[int]]
) -> None:
    """log_interval 10 but 0.15 s per step and log_interval_s 0.1: records leave in pairs, not tens."""
    spec = tiny_mlp_spec(max_steps=7, log_interval=10, log_interval_s=0.1, faults={"sleep_per_step_s": 0.15})
    train(spec, tmp_path, cpu_ctx)
    assert [step for batch in batches for step in batch] == list(range(1, 8))
    assert max(len(batch) for batch in batches) <= 2 and len(batches) >= 4


def test_records_pending_at_a_failure_are_written(
    tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext, tmp_path: Path
) -> None:
    spec = tiny_mlp_spec(max_steps=20, log_interval=10, faults={"raise_at_step": 5})
    with pytest.raises(RuntimeError, match="raise_at_step 5"):
        train(spec, tmp_path, cpu_ctx)
    assert [r["step"] for r in json_records(tmp_path) if r["type"] == "step"] == [1, 2, 3, 4]


def test_log_interval_is_bounded(tiny_mlp_spec: Callable[..., JobSpec]) -> None:
    assert tiny_mlp_spec().log_interval == 10
    for bad in (0, 10_001):
        with pytest.raises(ValueError, match="log_interval"):
            tiny_mlp_spec(log_interval=bad)
