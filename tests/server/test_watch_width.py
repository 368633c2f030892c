"""``halfcast watch`` on a narrow terminal (issue 13 item 4): the redrawn line fits, no redraw leaves a line behind.

The TTY output is played on :class:`terminal_support.Screen`, a terminal of the test's width.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest
from live_server import step_record
from terminal_support import FakeTerminal, Screen

from halfcast.cli.jobs import watch_job
from halfcast.cli.watch import Part, WatchView, fit
from halfcast.client import Event, HalfcastClient, JobEvent
from halfcast.contracts.resources import JobPublic
from halfcast.contracts.stored import StoredEval, StoredStep


def _job(**fields: Any) -> JobPublic:
    """A job resource with ``fields`` (an older server's: no ``loss_scaling``)."""
    return JobPublic.model_validate(
        {
            "id": "j",
            "name": None,
            "status": "starting",
            "spec": {},
            "step": 0,
            "max_steps": 1000,
            "world_size": 1,
            "created_at": "2026-12-02T10:00:00Z",
            "started_at": None,
            "finished_at": None,
            "error": None,
            "latest": None,
            "eval": None,
            "attempt": 1,
        }
        | fields
    )


def _events() -> Iterator[JobEvent]:
    """A start-up with its phases, ten long step records (tokens, an overflow with its forensics), an eval, the end."""
    yield Event("status", None, _job(status="starting", phase="launching"))
    yield Event("status", None, _job(status="running", phase="loading data"))
    yield Event("status", None, _job(status="running", phase=None))
    for step in range(1, 11):
        overflow: dict[str, Any] = {
            "overflow": True,
            "overflow_ranks": [0, 1],
            "nonfinite_param_count": 12,
            "nonfinite_params": [{"name": "transformer.h.11.mlp.c_proj.weight", "kind": "inf"}],
        }
        record = step_record(
            step,
            time=1000.0 + step,
            loss_scale=65536.0,
            tokens_per_second=123456.7,
            samples_per_second=9876.5,
            skipped_steps=int(step >= 4),
            **(overflow if step == 4 else {}),
        )
        yield Event("step", str(step), StoredStep.model_validate(record))
    yield Event("eval", None, StoredEval.model_validate({"step": 10, "loss": 0.5}))
    yield Event("status", None, _job(status="succeeded", phase=None))


class FakeClient:
    """The two calls ``watch_job`` makes."""

    def get(self, job_id: str) -> JobPublic:
        return _job(id=job_id)

    def events(self, job_id: str, after_step: int = 0) -> Iterator[JobEvent]:
        return _events()


@pytest.mark.parametrize("width", [80, 40])
def test_watch_on_a_narrow_terminal_fits_the_width_and_leaves_no_stale_line(
    width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = FakeTerminal()
    monkeypatch.setattr("sys.stdout", terminal)
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.delenv("LINES", raising=False)

    assert watch_job(cast(HalfcastClient, FakeClient()), "j") == 0  # a stand-in for the two calls it makes

    screen = Screen(width)
    screen.feed(terminal.getvalue())
    rows = screen.lines()
    assert screen.wraps == 0, rows
    assert rows[:4] == [
        "job j: starting (launching)",
        "job j: running (loading data)",
        "job j: running",
        "eval at step 10: loss 0.5",
    ], rows
    assert rows[5:] == ["job j: succeeded"] and len(rows) == 6, rows  # one progress row: no redraw left one behind
    progress = rows[4]
    assert " 10/1000" in f" {progress}" and "loss 0.1" in progress and "scale 2^16" in progress, progress
    assert ("skip 1" in progress or "skipped 1" in progress) and len(progress) <= width, progress
    if width == 80:  # everything the README promises (issue 25 item 10: skipped steps and samples/s were dropped)
        assert progress.startswith("[") and "9.88k samples/s" in progress, progress


def test_the_redrawn_line_is_never_longer_than_the_width_at_any_width() -> None:
    view = WatchView("j", max_steps=100_000)
    record = step_record(
        99_999,
        time=1.0,
        loss_scale=2.0**-14,
        tokens_per_second=1e9,
        overflow=True,
        nonfinite_params=[{"name": "a" * 200, "kind": "nan"}],
        nonfinite_param_count=9,
    )
    view.apply(Event("step", "99999", StoredStep.model_validate(record)))
    full = view.progress_line()
    assert "OVERFLOW in " + "a" * 200 in full and "tok/s" in full
    for width in range(len(full) + 2):
        line = view.progress_line(width)
        assert len(line) <= width, (width, line)
    assert view.progress_line(len(full)) == full
    assert view.progress_line(40) == "99999/100000 | loss 1e-05 | OVERFLOW"  # the bar goes before them
    assert view.progress_line(60) == "99999/100000 | loss 1e-05 | scale 2^-14 | skip 0 | OVERFLOW"  # then the ETA


def test_fit_shortens_then_drops_the_least_important_parts_first() -> None:
    parts = [Part(("AAAA",), 0, ""), Part(("BBBB", "B"), 2), Part(("CCCC",), 1), Part(("DDDD", "DD"), 3)]
    assert fit(parts, None) == "AAAA | BBBB | CCCC | DDDD"
    assert fit(parts, 23) == "AAAA | BBBB | CCCC | DD"
    assert fit(parts, 20) == "AAAA | B | CCCC | DD"  # every part shortened before any is dropped
    assert fit(parts, 15) == "AAAA | B | CCCC"
    assert fit(parts, 11) == "AAAA | CCCC"
    assert fit(parts, 4) == "AAAA" and fit(parts, 3) == "AAA"


@pytest.mark.parametrize("scales_loss", [True, False])
def test_every_field_the_readme_promises_fits_in_80_columns(scales_loss: bool) -> None:
    """Issue 25 item 10: progress, loss, loss scale, skipped steps and throughput all show at 80 columns, with the
    digits job's rate and long numbers; before, skipped steps and throughput were dropped (tokens/s and the ETA
    go first now)."""
    view = WatchView("j", max_steps=100_000, scales_loss=scales_loss)
    record = step_record(
        12_345,
        time=1.0,
        loss=0.123456789,
        loss_scale=65536.0,
        skipped_steps=1_234,
        samples_per_second=55_182.3,
        tokens_per_second=1_234_567.8,
    )
    view.apply(Event("step", "12345", StoredStep.model_validate(record)))
    line = view.progress_line(80)
    assert len(line) <= 80, line
    for field in ("12345/100000", "loss 0.123", "skip", "1234", "55.2k samples/s"):
        assert field in line, (field, line)
    assert ("scale 2^16" in line) is scales_loss, line
