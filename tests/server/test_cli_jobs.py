"""``halfcast submit|list|status|watch|cancel`` against a live API (uvicorn in a thread, SQLite)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from api_support import VALID_SPEC, FakeQueue, count_rows, insert_job
from live_server import (
    LiveServer,
    add_steps,
    free_port,
    set_status,
    sqlite_copy,
    step_record,
)
from sqlalchemy.orm import Session, sessionmaker
from terminal_support import FakeTerminal, Screen

from halfcast.cli import EXIT_BROKEN_PIPE, main
from halfcast.cli.watch import (
    WatchView,
    format_duration,
    format_scale,
    progress_bar,
    watch_output,
)
from halfcast.client import Event, HalfcastClient, JobEvent
from halfcast.common.strict_json import NONFINITE_MESSAGE
from halfcast.contracts.resources import JobPublic
from halfcast.contracts.stored import StoredEval, StoredStep
from halfcast.core.settings import Settings
from server.app import create_app
from server.streams.stats import EventStreamSettings, StreamStats

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def database_url(data_dir: Path, sqlite_template: Path) -> str:
    """SQLite only: the CLI's behaviour does not depend on the database."""
    return sqlite_copy(data_dir, sqlite_template)


@pytest.fixture
def url(settings: Settings, monkeypatch: pytest.MonkeyPatch, admin_token: str) -> Iterator[str]:
    """A live API; ``HALFCAST_URL`` points at it and ``HALFCAST_TOKEN`` holds an admin token."""
    app = create_app(settings, FakeQueue())
    app.state.event_streams = StreamStats(EventStreamSettings(poll_interval_s=0.05))
    with LiveServer(app) as live:
        monkeypatch.setenv("HALFCAST_URL", live.url)
        monkeypatch.setenv("HALFCAST_TOKEN", admin_token)
        yield live.url


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_submit_yaml_and_json_then_list_status_cancel(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({**VALID_SPEC, "name": "from-yaml"}))
    (tmp_path / "job.json").write_text(json.dumps({**VALID_SPEC, "name": "from-json"}))
    code, out, _ = _run(capsys, "submit", str(tmp_path / "job.yaml"))
    assert code == 0 and out.startswith("submitted job ") and out.rstrip().endswith("(queued)")
    yaml_id = out.split()[2]
    code, out, _ = _run(capsys, "submit", str(tmp_path / "job.json"), "--url", url)
    json_id = out.split()[2]
    code, out, _ = _run(capsys, "list")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["ID", "STATUS", "STEP"]
    assert out.index(json_id) < out.index(yaml_id) and "from-yaml" in out and "0/50" in out
    code, out, _ = _run(capsys, "status", yaml_id)
    assert code == 0 and "status:    queued" in out and "from-yaml" in out
    assert json.loads(_run(capsys, "status", yaml_id, "--json")[1])["id"] == yaml_id
    code, out, _ = _run(capsys, "cancel", yaml_id)
    assert (code, out) == (0, f"job {yaml_id}: cancelled\n")
    code, _, err = _run(capsys, "cancel", yaml_id)
    assert code == 1 and err == f"error: job {yaml_id} is already cancelled\n"


def test_submit_quiet_prints_only_the_id(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "job.json").write_text(json.dumps(VALID_SPEC))
    code, out, _ = _run(capsys, "submit", "-q", str(tmp_path / "job.json"))
    job_id = out.strip()
    assert code == 0 and out == f"{job_id}\n" and " " not in job_id
    assert json.loads(_run(capsys, "status", job_id, "--json")[1])["id"] == job_id


def test_a_closed_pipe_ends_the_command_quietly(url: str) -> None:
    """``halfcast list | head -1``: the reader leaves early; no traceback, exit 141 (128 + SIGPIPE)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "halfcast.cli", "list"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None
    process.stdout.close()  # the reader is gone before the command writes its first line
    _, err = process.communicate(timeout=60)
    assert process.returncode == EXIT_BROKEN_PIPE, err.decode()
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()


def test_an_invalid_spec_prints_each_field_and_its_message(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({**VALID_SPEC, "micro_batch_size": 0, "bogus": True}))
    code, out, err = _run(capsys, "submit", str(tmp_path / "bad.yaml"))
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert any(line.startswith("error: micro_batch_size: ") for line in lines), err
    assert any(line.startswith("error: bogus: ") for line in lines), err
    assert len(lines) == 2


def test_a_yaml_nan_or_inf_is_one_error_line_per_field_and_nothing_is_sent(
    url: str, tmp_path: Path, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    """YAML's ``.nan``/``.inf`` are floats JSON cannot carry: the CLI printed a traceback (httpx refused to encode them)."""
    (tmp_path / "nan.yaml").write_text(
        "model: {name: mlp}\ndataset: {name: digits}\nprecision: fp16\nmax_grad_norm: .nan\n"
        "loss_scale:\n  mode: dynamic\n  init_scale: .inf\nseed: -.inf\n"
    )
    code, out, err = _run(capsys, "submit", str(tmp_path / "nan.yaml"))
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"error: {field}: {NONFINITE_MESSAGE}" for field in ("max_grad_norm", "loss_scale.init_scale", "seed")
    ]
    assert count_rows(sessions) == 0


@pytest.mark.parametrize("text", ['"seed": NaN', '"seed": 1e309'], ids=["NaN", "1e309"])
def test_a_json_spec_with_a_nonfinite_number_is_refused_like_yaml(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    """Python's JSON parser reads ``NaN`` and ``1e309`` (as inf) from a ``.json`` file too."""
    (tmp_path / "nan.json").write_text(json.dumps(VALID_SPEC)[:-1] + f", {text}}}")
    code, _, err = _run(capsys, "submit", str(tmp_path / "nan.json"))
    assert (code, err) == (2, f"error: seed: {NONFINITE_MESSAGE}\n")


def test_a_yaml_date_is_one_error_line_not_a_traceback(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "date.yaml").write_text(
        yaml.safe_dump({**VALID_SPEC, "name": "x"}).replace("name: x", "name: 2024-01-31")
    )
    code, _, err = _run(capsys, "submit", str(tmp_path / "date.yaml"))
    assert code == 2 and err.startswith("error: name: a date is not a JSON value") and err.count("\n") == 1


def test_spec_file_errors_are_one_line(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "submit", str(tmp_path / "missing.yaml"))
    assert code == 1 and err.startswith("error: cannot read ") and err.count("\n") == 1
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    code, _, err = _run(capsys, "submit", str(tmp_path / "list.yaml"))
    assert code == 1 and "must hold a mapping" in err
    (tmp_path / "broken.json").write_text("{")
    code, _, err = _run(capsys, "submit", str(tmp_path / "broken.json"))
    assert code == 1 and "is not valid JSON" in err and err.count("\n") == 1


def test_a_server_that_is_down_is_one_clear_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HALFCAST_URL", f"http://127.0.0.1:{free_port()}")
    for argv in (["list"], ["status", "x"], ["watch", "x"], ["cancel", "x"]):
        code, out, err = _run(capsys, *argv)
        assert code == 3 and out == "", argv
        assert err.startswith("error: cannot reach the Halfcast API at http://127.0.0.1:") and err.count("\n") == 1, err


def test_an_unknown_job_is_one_line(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "status", "nope")
    assert (code, err) == (1, "error: job nope not found\n")


def test_watch_prints_plain_lines_when_not_a_tty(
    url: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer starts once the watch has shown the stream's first event (it slept 0.2 s instead: under load
    steps could be written before the stream opened, and the first line was not ``running``)."""
    job_id = insert_job(sessions, status="running")
    watching = threading.Event()
    events = HalfcastClient.events

    def opened(self: HalfcastClient, *args: Any, **kwargs: Any) -> Iterator[JobEvent]:
        for event in events(self, *args, **kwargs):
            yield event
            watching.set()  # the stream's first event (the job's status) was shown

    monkeypatch.setattr(HalfcastClient, "events", opened)

    def work() -> None:
        assert watching.wait(30), "the watch never opened its stream"
        for step in range(1, 6):
            forensics = (
                {
                    "overflow_ranks": [1],
                    "nonfinite_params": [{"name": "net.0.weight", "kind": "nan"}],
                    "nonfinite_param_count": 3,
                }
                if step == 2
                else {}
            )
            add_steps(
                sessions,
                job_id,
                [
                    step_record(
                        step,
                        overflow=step == 2,
                        skipped_steps=int(step >= 2),
                        loss_scale=2.0 ** (12 - int(step >= 2)),
                        **forensics,
                    )
                ],
            )
            time.sleep(0.05)
        set_status(sessions, job_id, "succeeded", eval={"step": 5, "loss": 0.25, "accuracy": 0.875})

    writer = threading.Thread(target=work)
    writer.start()
    code, out, _ = _run(capsys, "watch", job_id)
    writer.join()
    lines = out.splitlines()
    assert code == 0
    assert lines[0] == f"job {job_id}: running" and lines[-1] == f"job {job_id}: succeeded"
    steps = [line for line in lines if line.startswith("[")]
    assert len(steps) == 5 and "\r" not in out and "\x1b" not in out
    assert (
        "5/50" in steps[-1]
        and "scale 2048 (2^11)" in steps[-1]
        and "skipped 1" in steps[-1]
        and "500 samples/s" in steps[-1]
    )
    assert (
        "OVERFLOW in net.0.weight (nan) +2 more on rank 1" in steps[1]
        and "eval at step 5: loss 0.25, accuracy 0.875" in out
    )


def test_watch_exits_1_with_the_error_of_a_failed_job(
    url: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = insert_job(sessions, status="failed")
    set_status(
        sessions, job_id, "failed", error_reason="nonfinite_loss", error_message="the loss was NaN for 10 steps\ntrace"
    )
    code, out, _ = _run(capsys, "watch", job_id)
    assert code == 1 and out == f"job {job_id}: failed (nonfinite_loss: the loss was NaN for 10 steps)\n"


def test_the_tty_view_redraws_one_line_with_progress_eta_scale_and_throughput(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    out, view = FakeTerminal(), WatchView("j", max_steps=100)
    events: list[JobEvent] = [Event("status", None, _job(status="running", max_steps=100))]
    events += [
        Event(
            "step",
            str(step),
            _step(step_record(step, time=1000.0 + step, loss_scale=65536.0, tokens_per_second=1234.5)),
        )
        for step in range(1, 11)
    ]
    events.append(Event("eval", None, StoredEval.model_validate({"step": 10, "loss": 0.5})))
    with watch_output(out) as output:
        for event in events:
            output.show(view, event, view.apply(event))
    assert out.getvalue().count("\r") >= 10  # redrawn in place, once per step at least
    screen = Screen(200)
    screen.feed(out.getvalue())
    first, evaluation, last = screen.lines()
    assert (first, evaluation) == ("job j: running", "eval at step 10: loss 0.5")
    assert last.startswith(progress_bar(10, 100)) and "10/100 ETA 1m30s" in last
    assert "scale 65536 (2^16)" in last and "1234.5 tok/s" in last and "loss 0.1 " in last


def test_the_view_has_no_scale_column_for_a_job_that_does_no_loss_scaling() -> None:
    record = _step(step_record(3, time=1003.0, loss_scale=1.0))
    bf16 = WatchView("j", max_steps=10, scales_loss=False)
    bf16.apply(Event("step", "3", record))
    assert "scale" not in bf16.progress_line()
    fp16 = WatchView("j", max_steps=10)
    fp16.apply(Event("status", None, _job(status="running", max_steps=10, loss_scaling="none")))  # the resource decides
    fp16.apply(Event("step", "3", record))
    assert "scale" not in fp16.progress_line()
    fp16.apply(Event("status", None, _job(status="succeeded", max_steps=10, loss_scaling="dynamic")))
    assert " | scale 1 (2^0) | " in fp16.progress_line()


def test_formatting() -> None:
    assert [format_duration(s) for s in (None, 5, 65, 3725)] == ["?", "5s", "1m05s", "1h02m"]
    assert format_scale(1024.0) == "1024 (2^10)" and format_scale(3.0) == "3" and format_scale(None) == "-"
    assert progress_bar(5, 10, width=4) == "[##..]" and progress_bar(0, 0, width=2) == "[..]"


def _job(**fields: Any) -> JobPublic:
    """The resource of a running fp16 job, with ``fields``, as the client reads it."""
    base = {
        "id": "j",
        "name": None,
        "status": "running",
        "spec": {"precision": "fp16"},
        "created_at": "2026-12-02T10:00:00Z",
        "started_at": None,
        "finished_at": None,
        "error": None,
        "step": 0,
        "max_steps": 20,
        "world_size": 1,
        "latest": None,
        "eval": None,
        "attempt": 1,
    }
    return JobPublic.model_validate(base | fields)


def _step(record: dict[str, Any]) -> StoredStep:
    """A step event's record, as the client reads it."""
    return StoredStep.model_validate(record)


def _listed(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], jobs: list[JobPublic]) -> list[str]:
    """The lines ``halfcast list`` prints for a server that lists ``jobs``."""
    from halfcast.cli import jobs as cli_jobs

    class Client:
        def __enter__(self) -> Client:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def list(self, **kwargs: object) -> list[JobPublic]:
            return jobs

    monkeypatch.setattr(cli_jobs, "client_for", lambda args: Client())
    assert cli_jobs.run_list(argparse.Namespace(status=None, limit=20, json=False)) == 0
    return capsys.readouterr().out.splitlines()


def test_status_names_a_precision_switch() -> None:
    from halfcast.cli.jobs import describe

    job = _job(step=12, precision_switches=[])
    assert ("precision", "fp16") in describe(job)
    assert ("created", "2026-12-02T10:00:00Z") in describe(job)
    job = _job(
        step=12,
        precision_switches=[
            {
                "step": 12,
                "from": "fp16",
                "to": "bf16",
                "reason": "loss_scale_collapsed",
                "message": "...",
                "rewound_to_step": 8,
            }
        ],
    )
    assert ("precision", "fp16 -> bf16 at step 12 (loss_scale_collapsed; rewound to step 8)") in describe(job)


def test_status_shows_applied_and_skipped_steps() -> None:
    from halfcast.cli.jobs import describe

    latest = {"step": 10, "loss": 2.3, "loss_scale": 1.0, "skipped_steps": 10, "samples_per_second": 100.0}
    job = _job(status="failed", step=10, max_steps=10, latest=latest, applied_steps=0, skipped_steps=10)
    assert ("updates", "applied 0 / skipped 10") in describe(job)
    job = _job(status="failed", step=10, max_steps=10, latest=latest)  # an older server: derived from the latest record
    assert ("updates", "applied 0 / skipped 10") in describe(job)


def test_status_shows_the_whole_run_rate_once_succeeded() -> None:
    """Issue 25 item 9: a running job shows its latest trailing window, a succeeded one the whole run's rate."""
    from halfcast.cli.jobs import describe

    latest = {"step": 10, "loss": 2.3, "loss_scale": 1.0, "skipped_steps": 0, "samples_per_second": 55182.0}
    assert ("samples/s", "55182") in describe(_job(status="running", step=10, max_steps=10, latest=latest))
    done = _job(status="succeeded", step=10, max_steps=10, latest=latest, throughput={"samples_per_second": 3125.5})
    assert ("samples/s", "3125.5 (whole run)") in describe(done)


def test_status_shows_what_the_job_read_and_chose() -> None:
    """Issue 25 item 6: rows, splits after drops, rows dropped per split, the pad token."""
    from halfcast.cli.jobs import describe

    data = {
        "rows": 36,
        "train_examples": 28,
        "held_out_examples": 1,
        "dropped_rows": {"train": 4, "held_out": 2},
        "pad_token": {"id": 2, "token": "</s>", "source": "eos"},
    }
    text = (
        "36 rows: 28 train / 1 held out (fewer than 10: evaluation metrics are noisy); "
        "dropped 4 train, 2 held out (no supervised token); pad </s> (eos)"
    )
    assert ("data", text) in describe(_job(status="running", step=1, max_steps=10, data=data))


def test_status_shows_the_start_up_phase_and_its_times() -> None:
    from halfcast.cli.jobs import describe

    startup = {"launch_s": 1.52, "imports_s": 6.0, "data_s": 0.25, "model_s": None, "first_step_s": None}
    lines = describe(_job(phase="building model", startup=startup))
    assert ("phase", "building model") in lines and ("start-up", "launch 1.5 s, imports 6.0 s, data 0.2 s") in lines
    job = _job(status="succeeded")  # an older server has neither
    assert not {"phase", "start-up"} & {label for label, _ in describe(job)}


def test_status_and_list_show_no_loss_scale_for_a_job_that_does_no_scaling(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bf16 job's scale is always 1: ``status`` and ``list`` say ``none`` (the resource's ``loss_scaling``)."""
    from halfcast.cli.jobs import describe

    latest = {"step": 4, "loss": 0.5, "loss_scale": 1.0, "skipped_steps": 0, "samples_per_second": 10.0}
    bf16 = _job(id="b", step=4, max_steps=8, spec={"precision": "bf16"}, latest=latest, loss_scaling="none", name="b")
    fp16 = bf16.model_copy(
        update={
            "id": "f",
            "spec": {"precision": "fp16"},
            "loss_scaling": "dynamic",
            "latest": _step(latest | {"loss_scale": 1024.0}),
        }
    )
    assert ("scale", "none") in describe(bf16) and ("scale", "1024 (2^10)") in describe(fp16)

    header, bf16_row, fp16_row = _listed(monkeypatch, capsys, [bf16, fp16])
    column = header.split().index("SCALE")
    assert bf16_row.split()[column] == "none" and fp16_row.split()[column] == "1024"


def test_status_and_list_show_start_finish_duration_and_the_latest_eval(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 25 item 12: neither said when a job ran or how it evaluated last (``list``)."""
    from halfcast.cli.jobs import describe, duration_text

    done = _job(
        id="d",
        status="succeeded",
        step=20,
        started_at="2026-12-02T10:00:10Z",
        finished_at="2026-12-02T10:02:15Z",
        eval={"step": 20, "loss": 0.5, "accuracy": 0.9123},
    )
    lines = describe(done)
    assert ("started", "2026-12-02T10:00:10Z") in lines and ("finished", "2026-12-02T10:02:15Z") in lines
    assert ("duration", "2m05s") in lines
    waiting = _job(id="w", status="queued", eval={"step": 5, "loss": 0.25})
    assert ("started", "-") in describe(waiting) and ("duration", "-") in describe(waiting)
    running = _job(started_at="2026-12-02T10:00:00Z")
    assert duration_text(running, now=datetime(2026, 12, 2, 11, 2, tzinfo=UTC)) == "1h02m"

    header, done_row, waiting_row = _listed(monkeypatch, capsys, [done, waiting])
    eval_at, duration_at = header.split().index("EVAL"), header.split().index("DURATION")
    assert (done_row.split()[eval_at], done_row.split()[duration_at]) == ("acc=0.912", "2m05s")
    assert (waiting_row.split()[eval_at], waiting_row.split()[duration_at]) == ("loss=0.25", "-")
