"""The ``halfcast`` command line: parser, settings overrides, ``db upgrade``, and the ``up`` supervisor."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from halfcast.cli import build_parser, main
from halfcast.core.db.migrate import current_revision, head_revision
from halfcast.core.settings import Settings
from server.cli.services import api_command, apply_overrides
from server.cli.supervisor import Child, RestartPolicy, Supervisor

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_every_command_parses() -> None:
    parser = build_parser()
    assert parser.parse_args(["up", "--port", "9000", "--host", "0.0.0.0", "--data-dir", "d"]).port == 9000
    assert parser.parse_args(["api"]).handler.__name__ == "run_api"
    assert parser.parse_args(["worker", "--", "--hostname", "x@%h"]).celery_args == ["--", "--hostname", "x@%h"]
    assert parser.parse_args(["db", "upgrade"]).handler.__name__ == "run_upgrade"
    with pytest.raises(SystemExit):
        parser.parse_args([])


def test_overrides_become_the_environment_every_process_reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("HALFCAST_HOST", "HALFCAST_PORT", "HALFCAST_DATA_DIR"):
        monkeypatch.setenv(name, "")  # recorded, so whatever apply_overrides writes is undone
        monkeypatch.delenv(name)
    args = build_parser().parse_args(["up", "--port", "9123", "--data-dir", str(tmp_path / "d")])
    settings = apply_overrides(args)
    assert (settings.port, settings.resolved_data_dir) == (9123, (tmp_path / "d").resolve())
    assert os.environ["HALFCAST_PORT"] == "9123" and os.environ["HALFCAST_DATA_DIR"] == str((tmp_path / "d").resolve())
    assert Settings().port == 9123
    command = api_command(settings)
    assert command[1:4] == ["-m", "uvicorn", "--factory"] and "server.app:create_app" in command
    assert command[-2:] == ["--port", "9123"]


def test_db_upgrade_migrates_the_embedded_database(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("HALFCAST_DATABASE_URL", raising=False)
    monkeypatch.setenv("HALFCAST_DATA_DIR", str(tmp_path / "data"))
    assert main(["db", "upgrade"]) == 0
    assert current_revision(Settings().effective_database_url) == head_revision()
    assert head_revision() in capsys.readouterr().out


def test_supervisor_stops_the_others_when_one_child_exits() -> None:
    sleeper = Child("sleeper", SLEEPER, grace_s=5)
    quitter = Child("quitter", [sys.executable, "-c", "import sys; sys.exit(3)"], grace_s=5)
    started = time.monotonic()
    assert Supervisor([sleeper, quitter]).run(os.environ) == 3
    assert time.monotonic() - started < 20
    assert sleeper.popen is not None and sleeper.popen.returncode == -signal.SIGTERM


def _exits_after_counting(counter: Path, status: int = 3) -> list[str]:
    """A child that appends a line to ``counter`` and exits with ``status`` (at once)."""
    return [sys.executable, "-c", f"open({str(counter)!r}, 'a').write('x\\n'); raise SystemExit({status})"]


def test_supervisor_restarts_a_child_with_a_policy_and_the_others_run_on(tmp_path: Path) -> None:
    """A worker that dies is started again while the API keeps running; a crash loop stops everything."""
    counter = tmp_path / "starts"
    api = Child("api", SLEEPER, grace_s=5)
    policy = RestartPolicy(max_restarts=3, window_s=60, first_delay_s=0.05, max_delay_s=0.2)
    worker = Child("worker", _exits_after_counting(counter), grace_s=5, restart=policy)
    started = time.monotonic()
    assert Supervisor([api, worker]).run(os.environ) == 3
    assert counter.read_text().count("x") == 4  # the first start and 3 restarts, then the crash loop gives up
    assert api.popen is not None and api.popen.returncode == -signal.SIGTERM  # stopped only at the end
    assert time.monotonic() - started < 20


def test_a_restart_waits_longer_after_each_exit_and_resets_once_the_child_ran_stable() -> None:
    child = Child("worker", SLEEPER, restart=RestartPolicy(max_restarts=5, first_delay_s=1, max_delay_s=3, stable_s=10))
    delays = []
    for now in (100.0, 101.0, 103.0, 106.0):
        child.started_at = now - 0.5
        assert child.schedule_restart(now)
        delays.append((child.restart_at or 0) - now)
    assert delays == [1, 2, 3, 3]  # doubling, capped at max_delay_s
    child.started_at = 200.0
    assert child.schedule_restart(220.0) and child.restart_at == 221.0  # ran 20 s (stable): the series starts over
    assert not Child("api", SLEEPER).schedule_restart(0.0)  # no policy: never restarted


def test_supervisor_stops_every_child_on_sigterm_and_exits_0() -> None:
    children = [Child("a", SLEEPER, grace_s=5), Child("b", SLEEPER, grace_s=5)]
    supervisor = Supervisor(children)
    timer = threading.Timer(1.0, os.kill, args=(os.getpid(), signal.SIGTERM))
    timer.start()
    assert supervisor.run(os.environ) == 0
    assert all(child.popen is not None and child.popen.returncode == -signal.SIGTERM for child in children)


def test_supervisor_kills_a_child_that_ignores_sigterm() -> None:
    stubborn = Child(
        "stubborn",
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"],
        grace_s=0.5,
    )
    quitter = Child("quitter", [sys.executable, "-c", "import time; time.sleep(3)"], grace_s=5)
    assert Supervisor([stubborn, quitter]).run(os.environ) == 1
    assert stubborn.popen is not None and stubborn.popen.returncode == -signal.SIGKILL
