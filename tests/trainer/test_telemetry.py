"""Step records gathered on the device and written in batches: still one record per attempted step."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.distributed import DistContext
from trainer.loop import train
from trainer.records import RecordSink, read_records
from trainer.spec import JobSpec
from trainer.telemetry import FIELDS, StepLog

CPU = torch.device("cpu")


def _values(loss: float, kind: float, skipped: int, samples: int, tokens: int) -> list[torch.Tensor]:
    return [torch.tensor(loss), torch.tensor(1024.0), torch.tensor(kind), torch.tensor(skipped),
            torch.tensor(float("nan") if kind else 0.5), torch.tensor(0.1, dtype=torch.float64),
            torch.tensor(samples), torch.tensor(tokens)]


def test_rows_round_trip_exactly_and_the_log_is_bounded() -> None:
    log = StepLog(2, CPU)
    log.record(7, _values(0.25, 0.0, 0, 64, 2**40 + 1), has_tokens=True)
    log.record(8, _values(float("inf"), 2.0, 1, 64, 0), has_tokens=False)
    assert log.full and len(FIELDS) == 8
    with pytest.raises(RuntimeError, match="full"):
        log.record(9, _values(0.0, 0.0, 1, 1, 1), has_tokens=False)
    first, second = log.drain()
    assert (first.step, first.loss, first.loss_scale, first.lr, first.tokens) == (7, 0.25, 1024.0, 0.1, 2**40 + 1)
    assert not first.overflow and first.grad_norm == 0.5
    assert second.overflow and second.nan and second.tokens is None and second.skipped_steps == 1
    assert log.pending == 0 and log.drain() == []
    with pytest.raises(ValueError):
        log.record(1, _values(0.0, 0.0, 0, 1, 1)[:3], has_tokens=False)


def test_records_are_batched_at_log_interval_one_per_step(
    tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """log_interval 3, eval at 5, 8 steps: batches after steps 3, 5 (before the eval record), 8; each batch
    shares its interval's throughput; the step records are exactly steps 1..8 in order."""
    batches: list[list[int]] = []
    original = RecordSink.steps

    def spy(self: RecordSink, records: Any) -> None:
        items = list(records)
        batches.append([record.step for _, record in items])
        original(self, items)

    monkeypatch.setattr(RecordSink, "steps", spy)
    spec = tiny_mlp_spec(precision="fp16", max_steps=8, log_interval=3, eval_interval=5,
                         faults={"nonfinite_grad_steps": [2]})
    train(spec, tmp_path, cpu_ctx)
    assert batches == [[1, 2, 3], [4, 5], [6, 7, 8]]
    records = read_records(tmp_path)
    kinds = [(r["type"], r.get("step")) for r in records]
    assert kinds == [("start", None)] + [("step", s) for s in range(1, 6)] + [("eval", 5)] + \
        [("step", s) for s in range(6, 9)] + [("eval", 8), ("end", None)]
    steps = [r for r in records if r["type"] == "step"]
    assert [s["overflow"] for s in steps] == [False, True] + [False] * 6
    assert [s["skipped_steps"] for s in steps] == [0] + [1] * 7
    assert steps[1]["grad_norm"] is None and all(s["grad_norm"] > 0 for s in steps if not s["overflow"])
    for batch in batches:
        rates = {s["samples_per_second"] for s in steps if s["step"] in batch}
        assert len(rates) == 1 and next(iter(rates)) > 0
    assert all(a["time"] <= b["time"] for a, b in zip(steps, steps[1:]))
    assert records[0]["log_interval"] == 3


def test_records_pending_at_a_failure_are_written(
    tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext, tmp_path: Path
) -> None:
    spec = tiny_mlp_spec(max_steps=20, log_interval=10, faults={"raise_at_step": 5})
    with pytest.raises(RuntimeError, match="raise_at_step 5"):
        train(spec, tmp_path, cpu_ctx)
    assert [r["step"] for r in read_records(tmp_path) if r["type"] == "step"] == [1, 2, 3, 4]


def test_log_interval_is_bounded(tiny_mlp_spec: Callable[..., JobSpec]) -> None:
    assert tiny_mlp_spec().log_interval == 10
    for bad in (0, 10_001):
        with pytest.raises(ValueError, match="log_interval"):
            tiny_mlp_spec(log_interval=bad)
