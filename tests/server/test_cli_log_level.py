"""``halfcast --log-level LEVEL api|up``: uvicorn logs at that level too (issue 17).

uvicorn configures its own loggers (``uvicorn.error``, ``uvicorn.access``); unless it is
told the level it sets them to INFO, so ``--log-level WARNING`` still wrote one access
line per request (a cost per request under load, and noise).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_server import free_port, wait_until

from halfcast.cli import build_parser, main
from halfcast.core.db.migrate import upgrade_database
from server.cli.services import api_command, apply_overrides

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("clean_cli_environment")


@pytest.mark.parametrize(("argv", "expected"), [([], "info"), (["--log-level", "WARNING"], "warning")])
def test_halfcast_api_hands_the_log_level_to_uvicorn(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], expected: str
) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr("uvicorn.run", lambda app, **kwargs: calls.append(kwargs))
    assert main([*argv, "api"]) == 0
    assert calls[0]["log_level"] == expected


def test_halfcast_up_runs_uvicorn_at_the_log_level() -> None:
    args = build_parser().parse_args(["--log-level", "ERROR", "up"])
    command = api_command(apply_overrides(args), args.log_level)
    at = command.index("--log-level")
    assert command[at + 1] == "error"
    assert api_command(apply_overrides(args))[at + 1] == "info"  # the CLI's default


@pytest.mark.slow
def test_no_access_lines_at_warning(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    upgrade_database(f"sqlite:///{data / 'halfcast.db'}")
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("HALFCAST_")},
        "HALFCAST_AUTH": "off",
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "halfcast.cli", "--log-level", "WARNING", "api", "--port", str(port)]
    command += ["--data-dir", str(data)]
    log_path = tmp_path / "api.log"
    with log_path.open("wb") as out:
        api = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:

        def answers() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/jobs", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        assert wait_until(answers, 60), "the API did not answer"
        for _ in range(3):
            assert httpx.get(f"http://127.0.0.1:{port}/jobs/nope", timeout=5).status_code == 404
    finally:
        api.send_signal(signal.SIGTERM)
        api.wait(timeout=30)
    output = log_path.read_text()
    assert "GET /jobs" not in output and "INFO" not in output, output
