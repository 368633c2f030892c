"""Only ``halfcast/contracts/rundir.py`` spells the run directory's names; trainer, worker and server take them from it.

The check reads the source (``ast``) of every module of ``trainer/``, ``worker/`` and ``server/`` and
flags, outside docstrings:

- a string that is a run-directory file name (``"spec.json"``, ``"error.json"``, ``"final.pt"``...);
- a folder name (``"checkpoints"``, ``"logs"``, ``"export"``) joined onto a path (``path / "logs"``) or
  given a constant's name (``LOGS_DIR = "logs"``);
- a string or f-string part that begins a ``step-``, ``rank-`` or ``attempt-`` name or pattern
  (``f"step-{n}.pt"``, ``"rank-*.log"``, ``r"attempt-(\\d+)$"``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from halfcast.contracts import rundir

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("trainer", "worker", "server", "halfcast/core", "halfcast/cli", "halfcast/files")
FILE_NAMES = frozenset(
    {
        rundir.SPEC_FILE,
        rundir.RECORDS_FILE,
        rundir.ERROR_FILE,
        rundir.FINAL_CHECKPOINT,
        rundir.BEST_CHECKPOINT,
        rundir.LAUNCHER_LOG,
    }
)
DIR_NAMES = frozenset({rundir.CHECKPOINTS_DIR, rundir.LOGS_DIR, rundir.EXPORT_DIR})
#: The start of a ``step-<N>.pt``, ``rank-<r>.log`` or ``attempt-<n>`` name, a glob or a regular expression of one.
NAME_START = re.compile(r"(?:^|[\^(|])(?:step|rank|attempt)-(?:$|[*(\[\\{0-9])")


def _docstrings(tree: ast.Module) -> set[int]:
    """``id`` of every docstring node of the module, its classes and its functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                found.add(id(first.value))
    return found


def _joined(tree: ast.Module) -> set[int]:
    """``id`` of every string constant that is an operand of ``/`` (a path join) or an upper-case constant's value."""
    joined = {
        id(side)
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
        for side in (node.left, node.right)
        if isinstance(side, ast.Constant)
    }
    named = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id.isupper() for target in node.targets)
    }
    return joined | named


def spelled_names(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every run-directory name ``source`` spells itself."""
    tree = ast.parse(source)
    docstrings, joined = _docstrings(tree), _joined(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docstrings:
            continue
        text = node.value
        if text in FILE_NAMES or (text in DIR_NAMES and id(node) in joined) or NAME_START.search(text):
            found.append((node.lineno, text))
    return found


def _modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


@pytest.mark.parametrize(
    "source",
    [
        'x = "error.json"',
        'p = run_dir / "checkpoints"',
        'name = f"step-{step}.pt"',
        'files = d.glob("rank-*.log")',
        'ATTEMPT = re.compile(r"attempt-(\\d+)$")',
        'EXPORT_DIR = "export"',
        'NAME = r"^(final|step-[0-9]{1,18})\\.pt$"',
        'd = run / "logs" / name',
    ],
)
def test_the_check_sees_a_spelled_name(source: str) -> None:
    assert spelled_names(source), source


@pytest.mark.parametrize(
    "source",
    [
        '"""Writes ``checkpoints/step-<N>.pt`` and ``error.json``."""',
        'tags = ["checkpoints"]',
        'url = f"/jobs/{job_id}/checkpoints"',
        'name = f"{job_id}-attempt-{n}-{name}"',
        'help_text = "final.pt or step-<N>.pt"',
        'command = "logs"',
    ],
)
def test_the_check_lets_other_strings_be(source: str) -> None:
    assert spelled_names(source) == [], source


def test_no_module_outside_contracts_spells_a_run_directory_name() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for path in _modules()
        for line, text in spelled_names(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], "take these names from halfcast.contracts.rundir:\n" + "\n".join(offenders)
