"""pyproject.toml as the packaging tests read it: the client's requirements, and each extra's, by distribution name."""

from __future__ import annotations

import re
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "halfcast"
#: A requirement's distribution name and its extras: ``psycopg[binary]>=3.1`` -> ``psycopg``, ``binary``.
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")


@cache
def pyproject() -> dict[str, Any]:
    """The parsed pyproject.toml."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def normalized(name: str) -> str:
    """A distribution name as pip compares them (PEP 503): lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(requirement: str) -> tuple[str, list[str]]:
    """The normalized distribution name of ``requirement`` and the extras it asks for."""
    match = REQUIREMENT.match(requirement)
    assert match, requirement
    extras = [extra.strip() for extra in (match.group(2) or "").split(",") if extra.strip()]
    return normalized(match.group(1)), extras


def client_requirements() -> set[str]:
    """The distributions ``pip install halfcast`` brings (``[project] dependencies``)."""
    return {parse(requirement)[0] for requirement in pyproject()["project"]["dependencies"]}


def extras() -> dict[str, list[str]]:
    """Every extra and its requirements, as written."""
    return pyproject()["project"]["optional-dependencies"]


def own_requirements(extra: str) -> set[str]:
    """The distributions ``extra`` names itself (not through ``halfcast[...]``)."""
    return {name for name, _ in map(parse, extras()[extra]) if name != PROJECT}


def includes(extra: str) -> list[str]:
    """The extras ``extra`` brings through ``halfcast[...]`` requirements, directly."""
    return [included for name, asked in map(parse, extras()[extra]) if name == PROJECT for included in asked]


def resolved(extra: str) -> set[str]:
    """``extra`` and every extra it brings, at any depth."""
    result, todo = set(), [extra]
    while todo:
        name = todo.pop()
        if name not in result:
            result.add(name)
            todo.extend(includes(name))
    return result
