"""``halfcast logs JOB_ID [--rank] [--tail] [--attempt] [-f]`` against a live API (uvicorn in a thread, SQLite)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_support import FakeQueue, insert_job
from live_server import LiveServer, free_port, set_status, sqlite_copy
from sqlalchemy.orm import Session, sessionmaker

from halfcast.cli import main
from halfcast.contracts.rundir import JobRuns
from halfcast.core.settings import Settings
from server.app import create_app
from server.streams.stats import EventStreamSettings, StreamStats


@pytest.fixture
def database_url(data_dir: Path, sqlite_template: Path) -> str:
    """SQLite only: the CLI's behaviour does not depend on the database."""
    return sqlite_copy(data_dir, sqlite_template)


@pytest.fixture
def url(settings: Settings, monkeypatch: pytest.MonkeyPatch, admin_token: str) -> Iterator[str]:
    """A live API; ``HALFCAST_URL`` points at it and ``HALFCAST_TOKEN`` holds an admin token."""
    app = create_app(settings, FakeQueue())
    app.state.log_streams = StreamStats(EventStreamSettings(poll_interval_s=0.05))
    with LiveServer(app) as live:
        monkeypatch.setenv("HALFCAST_URL", live.url)
        monkeypatch.setenv("HALFCAST_TOKEN", admin_token)
        yield live.url


def _append(settings: Settings, job_id: str, text: str, attempt: int = 1, rank: int = 0) -> None:
    path = JobRuns.of(settings.runs_dir, job_id).attempt(attempt).rank_log(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(text)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_logs_prints_the_last_lines_of_a_rank(
    url: str, settings: Settings, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = insert_job(sessions, status="running")
    set_status(sessions, job_id, "running", world_size=2, attempt=2)
    _append(settings, job_id, "".join(f"r1 {i}\n" for i in range(10)), attempt=2, rank=1)
    _append(settings, job_id, "attempt one\n", attempt=1, rank=1)
    assert _run(capsys, "logs", job_id, "--rank", "1", "--tail", "2") == (0, "r1 8\nr1 9\n", "")
    assert _run(capsys, "logs", job_id, "--rank", "1", "--attempt", "1") == (0, "attempt one\n", "")


def test_logs_errors_are_one_line_with_the_usual_exit_codes(
    url: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _run(capsys, "logs", "nope") == (1, "", "error: job nope not found\n")
    queued = insert_job(sessions, status="queued")
    assert _run(capsys, "logs", queued) == (1, "", f"error: job {queued} has no logs yet: it is queued\n")
    running = insert_job(sessions, status="running")
    assert _run(capsys, "logs", running, "--rank", "1") == (
        1,
        "",
        f"error: job {running} has no rank 1: the job has ranks 0..0 (world size 1)\n",
    )
    monkeypatch.setenv("HALFCAST_URL", f"http://127.0.0.1:{free_port()}")
    code, _, err = _run(capsys, "logs", running)
    assert code == 3 and err.startswith("error: cannot reach the Halfcast API")


def test_a_rank_or_attempt_the_job_lacks_is_not_found_and_a_bad_argument_is_a_usage_error(
    url: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    """1, as for an unknown job or a missing checkpoint; 2 stays for what is rejected (issue 13: rank 3 exited 2)."""
    job_id = insert_job(sessions, status="running")
    set_status(sessions, job_id, "running", world_size=2, attempt=1)
    no_rank = f"error: job {job_id} has no rank 3: the job has ranks 0..1 (world size 2)\n"
    assert _run(capsys, "logs", job_id, "--rank", "3") == (1, "", no_rank)
    assert _run(capsys, "logs", job_id, "--rank", "3", "-f") == (1, "", no_rank)
    assert _run(capsys, "logs", job_id, "--attempt", "4") == (
        1,
        "",
        f"error: job {job_id} has no attempt 4: the job has 1 attempt(s) so far\n",
    )
    code, _, err = _run(capsys, "logs", job_id, "--tail", "20000")  # over the API's limit: a rejected argument
    assert (code, err.startswith("error: tail: ")) == (2, True), err
    for option, value in (("--rank", "-1"), ("--attempt", "0")):
        with pytest.raises(SystemExit) as exited:
            main(["logs", job_id, option, value])
        assert exited.value.code == 2 and "must be at least" in capsys.readouterr().err


def test_logs_follow_prints_new_lines_until_the_job_ends(
    url: str, settings: Settings, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = insert_job(sessions, status="running")
    _append(settings, job_id, "before\n")

    def job() -> None:  # the "worker": a few lines, then the job fails
        for i in range(3):
            time.sleep(0.1)
            _append(settings, job_id, f"step {i}\n")
        _append(settings, job_id, "Traceback: boom")
        set_status(sessions, job_id, "failed")

    writer = threading.Thread(target=job)
    writer.start()
    code, out, err = _run(capsys, "logs", job_id, "-f")
    writer.join()
    assert code == 1
    assert out == "before\nstep 0\nstep 1\nstep 2\nTraceback: boom\n"
    assert err == f"--- job {job_id}: attempt 1, rank 0 ---\n--- job {job_id}: failed ---\n"
    set_status(sessions, job_id, "succeeded")
    assert _run(capsys, "logs", job_id, "--follow", "--tail", "1")[:2] == (0, "Traceback: boom\n")


def test_ctrl_c_while_following_exits_130_without_a_traceback(
    url: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = insert_job(sessions, status="running")

    def interrupted(*_args: object, **_kwargs: object) -> Iterator[object]:
        raise KeyboardInterrupt
        yield  # a generator, like the real one

    monkeypatch.setattr("halfcast.client.HalfcastClient.follow_logs", interrupted)
    assert _run(capsys, "logs", job_id, "-f") == (130, "", "\ninterrupted\n")
