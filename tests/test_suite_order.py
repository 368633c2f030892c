"""The suite's order (tests/conftest.py): longest module first by the measured file, unmeasured ones by marker."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import suite_order
from module_durations import module_durations


@dataclass
class FakeItem:
    nodeid: str
    marks: list[str] = field(default_factory=list)

    def iter_markers(self) -> list[Any]:
        return [SimpleNamespace(name=name) for name in self.marks]  # the hook reads a mark's name only


def test_longest_measured_module_first_each_module_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({"tests/b.py": 100, "tests/c.py": 5}))
    monkeypatch.setattr(suite_order, "MODULE_DURATIONS", durations)
    items = [
        FakeItem("tests/a.py::one"),
        FakeItem("tests/a.py::two"),
        FakeItem("tests/c.py::one"),
        FakeItem("tests/new_e2e.py::one", ["e2e"]),
        FakeItem("tests/new_e2e.py::two"),  # a module counts by its longest-marked test
        FakeItem("tests/b.py::one"),
        FakeItem("tests/b.py::two", ["e2e"]),  # measured: the file wins over markers
    ]
    suite_order.order_longest_first(items)
    assert [item.nodeid for item in items] == [
        "tests/b.py::one",
        "tests/b.py::two",
        "tests/new_e2e.py::one",
        "tests/new_e2e.py::two",
        "tests/c.py::one",
        "tests/a.py::one",
        "tests/a.py::two",
    ]


def test_durations_are_summed_per_module_from_a_junit_report(tmp_path: Path) -> None:
    report = tmp_path / "run.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.e2e.test_x" name="a" time="3.4"/>'
        '<testcase classname="tests.e2e.test_x" name="b" time="1.2"/>'
        '<testcase classname="tests.test_y" name="a" time="9"/>'
        '<testcase classname="tests.test_z" name="a" time="0.5"/>'
        "</testsuite></testsuites>"
    )
    assert module_durations(report) == {"tests/test_y.py": 9, "tests/e2e/test_x.py": 5}


def test_the_measured_file_names_modules_that_exist() -> None:
    root = Path(__file__).resolve().parents[1]
    assert [m for m in json.loads(suite_order.MODULE_DURATIONS.read_text()) if not (root / m).is_file()] == []
