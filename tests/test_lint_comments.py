"""Every comment that silences a tool says which finding and why (docs/development.md, "Lint").

A bare ``# fmt: skip`` or ``# type: ignore`` hides a finding from the next engineer without telling them what
was traded; the rule is that each one names its reason (and, for mypy, its error code).
"""

from __future__ import annotations

import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bench", "examples", "halfcast", "migrations", "server", "tests", "trainer", "worker")

FMT_SKIP = re.compile(r"#\s*fmt:\s*skip\b(?P<rest>.*)$")
TYPE_IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]*\])?(?P<rest>.*)$")


def _comments(path: Path) -> Iterator[tuple[int, str]]:
    with path.open("rb") as source:
        for token in tokenize.tokenize(source.readline):
            if token.type == tokenize.COMMENT:
                yield token.start[0], token.string


def unjustified(comment: str) -> str | None:
    """Why ``comment`` breaks the rule, or None when it keeps it (or is not a silencing comment)."""
    fmt = FMT_SKIP.search(comment)
    if fmt is not None and not re.match(r"\s+#\s*\S", fmt["rest"]):
        return "# fmt: skip without a reason after a second #"
    ignore = TYPE_IGNORE.search(comment)
    if ignore is not None and not ignore["codes"]:
        return "# type: ignore without an error code"
    return None


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize(
    ("comment", "broken"),
    [("# fmt: skip", True), ("# fmt: skip  # a hand-laid case table", False), ("# fmt: skip # x", False),
     ("# type: ignore", True), ("# type: ignore[attr-defined]", False), ("# an ordinary comment", False)],
)  # fmt: skip  # a case table: one comment and its verdict a row
def test_the_rule_tells_a_bare_silencer_from_a_justified_one(comment: str, broken: bool) -> None:
    assert (unjustified(comment) is not None) == broken


def test_every_silencing_comment_names_its_reason() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {why}" for path in _sources() for line, comment in _comments(path)
             if (why := unjustified(comment)) is not None]  # fmt: skip  # the comprehension reads as one query
    assert found == []
