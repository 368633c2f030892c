"""``halfcast api|up --workers N`` / ``HALFCAST_API_WORKERS``: several uvicorn processes serve the API."""

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


def test_workers_option_becomes_the_setting_and_the_uvicorn_command() -> None:
    settings = apply_overrides(build_parser().parse_args(["up", "--workers", "3"]))
    assert settings.api_workers == 3 and os.environ["HALFCAST_API_WORKERS"] == "3"
    assert api_command(settings)[-2:] == ["--workers", "3"]
    single = apply_overrides(build_parser().parse_args(["up", "--workers", "1"]))
    assert "--workers" not in api_command(single)


def test_workers_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["api", "--workers", "0"])
    assert "must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [(["api"], None, 1), (["api", "--workers", "2"], None, 2), (["api"], "4", 4), (["api", "--workers", "2"], "4", 2)],
)
def test_halfcast_api_hands_the_worker_count_to_uvicorn(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], env: str | None, expected: int
) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr("uvicorn.run", lambda app, **kwargs: calls.append({"app": app, **kwargs}))
    if env is not None:
        monkeypatch.setenv("HALFCAST_API_WORKERS", env)
    assert main(argv) == 0
    assert (
        calls[0]["workers"] == expected and calls[0]["factory"] is True and calls[0]["app"] == "server.app:create_app"
    )


def _worker_processes(pid: int) -> list[int]:
    """The uvicorn worker processes (multiprocessing spawns) whose parent is ``pid``."""
    workers = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                spawned = b"spawn_main" in (entry / "cmdline").read_bytes()
            except (OSError, IndexError):
                continue
            if parent == pid and spawned:
                workers.append(int(entry.name))
    return workers


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="counts processes through /proc")
def test_two_workers_serve_the_api_and_stop_together(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    upgrade_database(f"sqlite:///{data / 'halfcast.db'}")
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("HALFCAST_")},
        "HALFCAST_AUTH": "off",
        "PYTHONPATH": str(ROOT),
    }
    command = [
        sys.executable,
        "-m",
        "halfcast.cli",
        "api",
        "--workers",
        "2",
        "--port",
        str(port),
        "--data-dir",
        str(data),
    ]
    api = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:

        def answers() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/jobs", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        assert wait_until(answers, 60), "the API did not answer"
        assert wait_until(lambda: len(_worker_processes(api.pid)) == 2, 30), _worker_processes(api.pid)
        workers = _worker_processes(api.pid)
    finally:
        api.send_signal(signal.SIGTERM)
        api.wait(timeout=30)
    assert wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), 10)
