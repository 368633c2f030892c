"""The records sink: JSON lines, flushed per line, rank 0 only, strict JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from trainer_support import json_records

from trainer.records import RecordSink, StepRecord

STEP = StepRecord(
    step=1,
    loss=float("nan"),
    loss_scale=65536.0,
    overflow=True,
    skipped_steps=1,
    grad_norm=None,
    lr=0.1,
    samples_per_second=100.0,
    tokens_per_second=None,
)


def test_lines_are_flushed_as_written(tmp_path: Path) -> None:
    sink = RecordSink(tmp_path / "records.jsonl")
    sink.start(world_size=1, device="cpu")
    sink.step(STEP)
    lines = (tmp_path / "records.jsonl").read_text().splitlines()  # before close
    assert len(lines) == 2
    sink.eval(1, {"loss": 0.5, "accuracy": 0.9})
    sink.end(steps=1, skipped_steps=1)
    sink.close()
    records = json_records(tmp_path)
    assert [r["type"] for r in records] == ["start", "step", "eval", "end"]
    assert all(isinstance(r["time"], float) for r in records)
    step = records[1]
    assert set(step) == {
        "type",
        "time",
        "step",
        "loss",
        "loss_scale",
        "overflow",
        "skipped_steps",
        "grad_norm",
        "lr",
        "samples_per_second",
        "tokens_per_second",
        "underflow_fraction",
        "overflow_ranks",
        "nonfinite_params",
        "nonfinite_param_count",
        "samples_total",
        "tokens_total",
    }
    assert records[2] == {**records[2], "step": 1, "loss": 0.5, "accuracy": 0.9}


def test_non_finite_values_become_null(tmp_path: Path) -> None:
    with RecordSink(tmp_path / "records.jsonl") as sink:
        sink.step(STEP)
        sink.eval(2, {"loss": float("inf"), "perplexity": float("inf")})
    raw = (tmp_path / "records.jsonl").read_text()
    assert "NaN" not in raw and "Infinity" not in raw
    first, second = (json.loads(line) for line in raw.splitlines())
    assert first["loss"] is None and second["perplexity"] is None


def test_other_ranks_write_nothing(tmp_path: Path) -> None:
    with RecordSink(None) as sink:
        sink.step(STEP)
    assert list(tmp_path.iterdir()) == [] and json_records(tmp_path) == []


@pytest.mark.parametrize(
    "fields",
    [
        {"loss": 0.5, "grad_norm": 1.25, "lr": 1e-20, "samples_total": 2**40 + 1},
        {
            "loss": float("nan"),
            "grad_norm": float("inf"),
            "overflow": True,
            "overflow_ranks": [0],
            "nonfinite_params": [{"name": "fc.weight", "kind": "nan"}],
            "nonfinite_param_count": 1,
        },
        {"loss": 0.25, "precision": "bf16", "underflow_fraction": 0.125},
    ],
)
def test_a_step_line_is_the_records_line_object(fields: dict[str, Any]) -> None:
    """The flush's one-call serialisation parses to exactly ``StepRecord.line()`` (keys in order too)."""
    from trainer.records import StepRecord, step_line

    record = StepRecord(step=3, time=12.5, loss_scale=1024.0, skipped_steps=0, **fields)
    parsed = json.loads(step_line(record))
    assert parsed == record.line() and list(parsed) == list(record.line())
