"""The launch wrapper: a run gets SIGTERM when its worker dies, even by SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from worker.launch.deathsig import PARENT_GONE_EXIT
from worker.launch.process_tree import read_proc

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")


def _alive(pid: int) -> bool:
    info = read_proc(pid)
    return info is not None and info.alive


def test_the_run_dies_with_its_parent(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    parent_code = (
        "import os, subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-m', 'worker.launch.deathsig', str(os.getpid()), '--', "
        "'sleep', '300'], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(300)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        child = int(pid_file.read_text())
        time.sleep(0.5)  # the wrapper has exec'd into sleep
        assert _alive(child) and Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"sleep")
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(child):
            assert time.monotonic() < deadline, "the run outlived its killed parent"
            time.sleep(0.05)
    finally:
        parent.kill()
        if pid_file.exists() and pid_file.read_text() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_the_wrapper_exits_when_its_parent_is_already_gone() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "worker.launch.deathsig", "1", "--", "sleep", "300"], cwd=ROOT, timeout=30
    )
    assert result.returncode == PARENT_GONE_EXIT


def test_nice_lowers_the_priority_of_the_command_and_what_it_starts() -> None:
    """``--nice N`` adds N to the niceness before the exec: the run and every process it forks inherit it."""
    code = "import os, subprocess, sys; print(os.nice(0)); sys.stdout.flush(); subprocess.run(['nice'])"
    out = subprocess.run(
        [sys.executable, "-m", "worker.launch.deathsig", "--nice", "7", str(os.getpid()), "--", sys.executable, "-c", code],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()  # fmt: skip  # the keyword arguments on one line
    assert out == [str(os.nice(0) + 7)] * 2


@pytest.mark.parametrize("argv", [["--nice"], ["--nice", "x", "1", "--", "true"], ["--nice", "3", "--", "true"]])
def test_a_malformed_command_line_is_refused_with_the_usage(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "worker.launch.deathsig", *argv], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2 and "usage: python -m worker.launch.deathsig [--nice N]" in done.stderr
