"""A pytest plugin that says where a run's CPU time goes: CPU seconds per test, the processes it waited on included.

    pytest -p cpu_accounting --cpu-log=/tmp/cpu.jsonl ...
    python tests/cpu_accounting.py /tmp/cpu.jsonl      # each worker's span, then CPU seconds per module

On the 2-core machine the suite is CPU-bound (every worker busy), so its wall time follows its CPU
time, not its tests' wall time. Each test's line holds its user and system seconds and those of the
child processes it waited for (stacks, torchrun ranks, CLIs): ``getrusage`` of the worker process
and of its reaped children, around the test's whole protocol (a module fixture's teardown counts
with the module's last test). Servers outside the suite (PostgreSQL, Redis) are not counted.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-log", default=None, help="append each test's CPU seconds to this JSON-lines file")


def _cpu_seconds() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    path = item.config.getoption("--cpu-log")
    before, started = _cpu_seconds(), time.time()
    yield
    if path:
        after = _cpu_seconds()
        line = {
            "nodeid": item.nodeid,
            "self": after[0] - before[0],
            "children": after[1] - before[1],
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "start": started,
            "end": time.time(),
        }
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


def module_cpu(log: Path) -> Counter[str]:
    """CPU seconds (own and children's) per module in ``log``."""
    seconds: Counter[str] = Counter()
    for line in log.read_text().splitlines():
        row = json.loads(line)
        seconds[row["nodeid"].split("::", 1)[0]] += row["self"] + row["children"]
    return seconds


def worker_spans(log: Path) -> dict[str, tuple[float, float, float]]:
    """Per xdist worker: seconds from the run's first test to its own first and last test's end, and its busy seconds."""
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    rows = [row for row in rows if "start" in row]
    if not rows:
        return {}
    origin = min(row["start"] for row in rows)
    spans: dict[str, tuple[float, float, float]] = {}
    for worker in sorted({row["worker"] for row in rows}):
        mine = [row for row in rows if row["worker"] == worker]
        first = min(row["start"] for row in mine) - origin
        last = max(row["end"] for row in mine) - origin
        spans[worker] = (first, last, sum(row["end"] - row["start"] for row in mine))
    return spans


if __name__ == "__main__":
    for worker, (first, last, busy) in worker_spans(Path(sys.argv[1])).items():
        sys.stdout.write(f"{worker}: tests from {first:.0f} s to {last:.0f} s, {busy:.0f} s in tests\n")
    totals = module_cpu(Path(sys.argv[1]))
    sys.stdout.write(f"{sum(totals.values()):8.0f} s CPU in all\n")
    for module, seconds in totals.most_common(40):
        sys.stdout.write(f"{seconds:8.0f} {module}\n")
