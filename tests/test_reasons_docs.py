"""The failure-reason tables of docs/results.md and docs/architecture.md list exactly the worker's reasons."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from worker.lifecycle.reasons import FAILURE_REASONS

ROOT = Path(__file__).resolve().parents[1]


def reasons_table(path: Path, heading: str) -> set[str]:
    """Reasons named in the first table after the line containing ``heading``."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if heading in line)
    rows: list[str] = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    return {m.group(1) for row in rows if (m := re.match(r"\| `(\w+)` \|", row))}


@pytest.mark.parametrize(
    ("doc", "heading"),
    [("docs/results.md", "**Failure reasons**"), ("docs/architecture.md", "## Typed failure reasons")],
)
def test_the_reason_table_matches_the_worker(doc: str, heading: str) -> None:
    documented = reasons_table(ROOT / doc, heading)
    assert documented == set(FAILURE_REASONS), {
        "undocumented": sorted(set(FAILURE_REASONS) - documented),
        "unknown": sorted(documented - set(FAILURE_REASONS)),
    }


def test_every_trainer_reason_is_a_worker_reason() -> None:
    from trainer.errors import REASONS

    assert REASONS <= FAILURE_REASONS, sorted(REASONS - FAILURE_REASONS)
