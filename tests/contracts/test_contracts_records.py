"""The records of ``records.jsonl`` round-trip: what the trainer's sink writes, the worker reads back as the same model."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from halfcast.contracts.records import (
    EndRecord,
    EvalRecord,
    PhaseRecord,
    PrecisionSwitch,
    PrecisionSwitchRecord,
    StartRecord,
    StepRecord,
    parse_record,
)
from halfcast.contracts.rundir import RunDir
from halfcast.contracts.stored import StoredSwitch
from trainer.records import RecordSink
from worker.records.ingest import end_info, ingest, parse_lines
from worker.records.tail import RecordTail

STEP = StepRecord(
    step=3,
    loss=0.5,
    loss_scale=65536.0,
    overflow=False,
    skipped_steps=1,
    grad_norm=0.25,
    lr=0.01,
    samples_per_second=100.0,
    tokens_per_second=None,
    samples_total=96,
    tokens_total=None,
)
SWITCH = {
    "step": 12,
    "from": "fp16",
    "to": "bf16",
    "reason": "loss_scale_collapsed",
    "message": "collapsed",
    "rewound_to_step": 8,
    "time": 50.0,
}
STOPPED = {"step": 3, "metric": "loss", "best_step": 2, "best_value": 0.25}


def _write_run(run: RunDir) -> None:
    """One of each record, as the trainer writes them (the loop's calls on its sink)."""
    with RecordSink(run.records) as sink:
        sink.phase("data", {"launch_s": 0.5, "imports_s": 1.5, "data_s": None, "model_s": None, "first_step_s": None})
        sink.start(
            world_size=2,
            device="cpu",
            precision="fp16",
            accumulation_steps=1,
            startup={"launch_s": 0.5},
            resumed_from_step=0,
            precision_switch=SWITCH,
            data={"rows": 10},
        )
        sink.step(STEP, when=10.0)
        sink.eval(3, {"loss": 0.4, "accuracy": 0.9})
        sink.precision_switch(SWITCH)
        sink.step_fields = {"precision": "bf16"}
        sink.steps([(11.0, STEP.model_copy(update={"step": 9}))])
        sink.end(steps=3, skipped_steps=1, stopped_early=STOPPED, exported_step=2)


def _read_back(run: RunDir) -> list[Any]:
    """What the worker reads of the run's records."""
    return parse_lines(RecordTail(run.records).drain())


def test_every_record_the_trainer_writes_reads_back_as_the_same_model(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    _write_run(run)
    records = _read_back(run)
    assert [type(record) for record in records] == [
        PhaseRecord,
        StartRecord,
        StepRecord,
        EvalRecord,
        PrecisionSwitchRecord,
        StepRecord,
        EndRecord,
    ]
    phase, start, step, evaluation, switch, bf16_step, end = records
    assert step == STEP.model_copy(update={"time": 10.0})
    assert bf16_step == STEP.model_copy(update={"step": 9, "time": 11.0, "precision": "bf16"})
    assert evaluation.step == 3 and (evaluation.loss, evaluation.accuracy, evaluation.perplexity) == (0.4, 0.9, None)
    assert switch.body() == SWITCH and switch.from_ == "fp16"
    assert start.world_size == 2 and start.precision_switch is not None and start.precision_switch.body() == SWITCH
    assert start.model_extra == {} and start.data is not None and start.data.rows == 10  # typed: DataReport
    assert phase.phase == "data" and phase.startup.imports_s == 1.5
    assert end == EndRecord(
        time=end.time, steps=3, skipped_steps=1, applied_steps=2, stopped_early=STOPPED, exported_step=2
    )
    assert all(isinstance(record.time, float) for record in records)


def test_each_line_is_the_models_line(tmp_path: Path) -> None:
    """The file holds exactly :meth:`line` of each record read back: nothing is lost or added on the way."""
    run = RunDir(tmp_path)
    _write_run(run)
    lines = [json.loads(text) for text in run.records.read_text().splitlines()]
    assert [record.line() for record in _read_back(run)] == lines
    step = lines[2]
    assert set(step) == {"type", "time", *StepRecord.model_fields} - {"precision"}  # every field, null where unset
    assert lines[5]["precision"] == "bf16"


def test_the_worker_ingests_what_the_trainer_wrote(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    _write_run(run)
    ingested = ingest(_read_back(run))
    progress = ingested.progress
    # the switch rewound to step 8: step 3 and its evaluation are kept, then the bf16 re-run of step 9
    assert [record.step for record in progress.steps] == [3, 9]
    assert [record.step for record in progress.evals] == [3]
    assert [switch.body() for switch in progress.switches] == [SWITCH]
    assert [switch.body() for switch in progress.known_switches] == [SWITCH]
    assert progress.world_size == 2
    assert progress.startup == {
        "phase": "data",
        "launch_s": 0.5,
        "imports_s": 1.5,
        "data_s": None,
        "model_s": None,
        "first_step_s": None,
    }
    assert ingested.end is not None
    assert end_info(ingested.end) == {
        "steps": 3,
        "skipped_steps": 1,
        "applied_steps": 2,
        "stopped_early": STOPPED,
        "exported_step": 2,
    }


def test_non_finite_numbers_are_written_and_read_as_null(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    with RecordSink(run.records) as sink:
        sink.step(STEP.model_copy(update={"loss": float("nan"), "grad_norm": float("inf")}))
        sink.start(world_size=1, model={"scale": float("-inf"), "sizes": [float("nan")]})
    raw = run.records.read_text()
    assert "NaN" not in raw and "Infinity" not in raw
    step, start = _read_back(run)
    assert (step.loss, step.grad_norm) == (None, None)
    assert start.model == {"scale": None, "sizes": [None]}


def test_an_older_trainers_lines_still_read_and_keep_only_what_they_said() -> None:
    """Fields a newer trainer added are optional; a field the worker does not know travels on."""
    record = parse_record({"type": "step", "step": 1, "time": 2.0, "loss": 0.5, "future_field": [1, 2]})
    assert isinstance(record, StepRecord) and record.samples_total is None
    assert record.body() == {"step": 1, "time": 2.0, "loss": 0.5, "future_field": [1, 2]}
    end = parse_record({"type": "end", "time": 1.0, "steps": 4, "skipped_steps": 1})
    assert isinstance(end, EndRecord) and end.applied == 3 and end.applied_steps is None


@pytest.mark.parametrize(
    "line",
    [{"type": "step"}, {"type": "step", "step": "3"}, {"type": "step", "step": True}, {"type": "eval", "loss": 0.1},
     {"type": "precision_switch", "step": 3}, {"type": "end", "steps": 3}, {"type": "end", "steps": 3, "skipped_steps": -1},
     {"type": "phase", "phase": "sleeping"}, {"type": "phase", "phase": "data", "startup": {"data_s": -1.0}},
     {"type": "start", "world_size": "2"}, {"type": "unknown"}, {"step": 3}],
)  # fmt: skip  # a case table, laid out by hand
def test_a_line_that_is_no_valid_record_is_skipped(line: dict[str, Any]) -> None:
    assert parse_record(line) is None


def test_a_precision_switch_has_one_model_from_the_trainer_to_the_api() -> None:
    """Issue 30 item 3: the trainer's switch, its record line and the API's are one model (were three classes)."""
    root = Path(__file__).resolve().parents[2]
    defined = [
        str(path.relative_to(root))
        for package in ("halfcast", "trainer", "worker", "server")
        for path in sorted((root / package).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef) and node.name == "PrecisionSwitch"
    ]
    assert defined == ["halfcast/contracts/records.py"]
    assert issubclass(PrecisionSwitchRecord, PrecisionSwitch) and issubclass(StoredSwitch, PrecisionSwitch)


def test_a_switch_kept_in_a_checkpoint_reads_back_as_the_same_switch() -> None:
    """What the trainer stores in a checkpoint (``body()``, plain JSON for ``weights_only`` loads) and its line."""
    switch = PrecisionSwitch(
        step=7, from_="fp16", to="bf16", reason="loss_diverged", message="x", rewound_to_step=5, time=1.5
    )
    body = switch.body()
    assert body == {
        "step": 7,
        "from": "fp16",
        "to": "bf16",
        "reason": "loss_diverged",
        "message": "x",
        "rewound_to_step": 5,
        "time": 1.5,
    }
    assert PrecisionSwitch.model_validate(body) == switch
    assert PrecisionSwitchRecord.model_validate(body).line() == {"type": "precision_switch", **body}


def test_database_rows_and_contract_models_are_named_apart() -> None:
    """Issue 30 item 3: ``StepRecord`` is the record's model, ``StepRow`` its row (both were ``StepRecord``)."""
    root = Path(__file__).resolve().parents[2]

    def classes(folder: Path) -> set[str]:
        return {
            node.name
            for path in folder.rglob("*.py")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.ClassDef)
        }

    assert classes(root / "halfcast" / "core" / "db") & classes(root / "halfcast" / "contracts") == set()
