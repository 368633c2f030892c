"""Start-up phases (issue 13 item 3): timed from the launch, logged, written as ``phase`` records and in ``start``."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from trainer_support import json_records

from halfcast.contracts.spec import JobSpec
from trainer.parallel.distributed import DistContext
from trainer.records import RECORDS_FILE, RecordSink
from trainer.run.loop import train
from trainer.startup import (
    LAUNCHED_AT_ENV,
    RANK_STARTED_AT_ENV,
    StartupClock,
    StartupTimes,
    entry_times,
)

TIMES = ("launch_s", "imports_s", "data_s", "model_s", "first_step_s")


def test_the_clock_times_each_phase_from_the_launch_and_writes_a_record_as_it_begins(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ticks = itertools.count(1010.0, 0.5).__next__  # entered at 1010.0, then every call 0.5 s later
    env = {LAUNCHED_AT_ENV: "1000.0", RANK_STARTED_AT_ENV: "1002.5"}
    caplog.set_level(logging.INFO, "trainer.startup")
    with RecordSink(tmp_path / RECORDS_FILE) as sink:
        clock = StartupClock.entered(sink, True, env, clock=ticks)
        for phase in ("model", "first_step", "training"):
            clock.begin(phase)
    records = json_records(tmp_path)
    assert [(r["type"], r["phase"]) for r in records] == [
        ("phase", p) for p in ("data", "model", "first_step", "training")
    ]
    assert records[-1]["startup"] == {
        "launch_s": 2.5,
        "imports_s": 7.5,
        "data_s": 0.5,
        "model_s": 0.5,
        "first_step_s": 0.5,
    }
    assert records[0]["startup"] == {
        "launch_s": 2.5,
        "imports_s": 7.5,
        "data_s": None,
        "model_s": None,
        "first_step_s": None,
    }
    assert records[1]["startup"]["data_s"] == 0.5 and records[1]["startup"]["model_s"] is None
    assert [m for m in caplog.messages if m.startswith("start-up: ")] == [
        "start-up: loading data (launch 2.50 s, imports 7.50 s)",
        "start-up: building the model (launch 2.50 s, imports 7.50 s, data 0.50 s)",
        "start-up: running the first step (launch 2.50 s, imports 7.50 s, data 0.50 s, model 0.50 s)",
        "start-up: done, training (launch 2.50 s, imports 7.50 s, data 0.50 s, model 0.50 s, first step 0.50 s)",
    ]


def test_other_ranks_time_but_neither_log_nor_write(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "trainer.startup")
    clock = StartupClock.entered(RecordSink(None), False, {})
    clock.begin("model")
    assert clock.times.data_s is not None and clock.phase == "model"
    assert not caplog.messages and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("env", "expected"), [
    ({}, StartupTimes()),
    ({LAUNCHED_AT_ENV: "x", RANK_STARTED_AT_ENV: "nan"}, StartupTimes()),
    ({RANK_STARTED_AT_ENV: "9.0"}, StartupTimes(imports_s=1.0)),
    ({LAUNCHED_AT_ENV: "5", RANK_STARTED_AT_ENV: "4"}, StartupTimes(launch_s=0.0, imports_s=6.0)),  # clocks apart: never < 0
])  # fmt: skip  # a case table, laid out by hand
def test_without_the_launchers_stamps_launch_and_imports_are_unknown(
    env: dict[str, str], expected: StartupTimes
) -> None:
    assert entry_times(env, entered_at=10.0) == expected


def test_a_run_reports_its_phases_before_the_start_record_and_its_first_step_at_once(
    tiny_mlp_spec: Callable[..., JobSpec], cpu_ctx: DistContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """log_interval 10 without a time limit: step 1 is still written on its own, followed by the ``training`` phase."""
    monkeypatch.setenv(LAUNCHED_AT_ENV, "1.0")
    monkeypatch.setenv(RANK_STARTED_AT_ENV, "2.0")
    train(tiny_mlp_spec(max_steps=4, log_interval=10, log_interval_s=None), tmp_path, cpu_ctx)
    records = json_records(tmp_path)
    kinds = [(r["type"], r.get("phase") or r.get("step")) for r in records]
    assert kinds[:6] == [
        ("phase", "data"),
        ("phase", "model"),
        ("phase", "first_step"),
        ("start", None),
        ("step", 1),
        ("phase", "training"),
    ]
    start, done = records[3], records[5]
    assert start["startup"] == records[2]["startup"] and set(start["startup"]) == set(TIMES)
    assert start["startup"]["launch_s"] == 1.0 and start["startup"]["first_step_s"] is None
    assert all(isinstance(done["startup"][name], float) and done["startup"][name] >= 0 for name in TIMES)
    assert done["time"] >= records[4]["time"] and [r["type"] for r in records].count("phase") == 4
