"""Strict JSON (RFC 8259): no ``NaN``, ``Infinity`` or ``-Infinity``, and no number too large for a double.

Python's :func:`json.loads` accepts the three literals and turns ``1e309`` into
``inf``; none of them is JSON, and a non-finite float cannot be answered back
(strict JSON rendering raises on it) nor stored in PostgreSQL's ``json``. This
module says where a document or a Python value stops being strict JSON, by path, so
the API can reject a request body at the field that holds the number
(:func:`loads_strict`) and the client can refuse a spec before sending it
(:func:`json_value_problems`; YAML's ``.nan``/``.inf`` parse to such floats).

It imports nothing but the standard library: the client uses it too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

#: What a rejected non-finite number is told (the 422 ``msg``, the CLI's error line).
NONFINITE_MESSAGE = (
    "non-finite numbers are not JSON (NaN, Infinity, -Infinity, or beyond +-1.8e308 like 1e309): send a finite number"
)
#: At most this many non-finite numbers are reported for one document.
MAX_REPORTED = 20

#: A position in a JSON document: object keys and array indices from the root.
JsonPath = tuple[str | int, ...]


@dataclass(frozen=True)
class NonFinite:
    """A non-finite number at ``path``; ``text`` is how it was written (``NaN``, ``1e309``)."""

    path: JsonPath
    text: str


class NonFiniteNumbers(ValueError):
    """The document holds non-finite numbers (``found``: at most :data:`MAX_REPORTED`, in document order)."""

    def __init__(self, found: list[NonFinite]) -> None:
        super().__init__(f"{NONFINITE_MESSAGE} (at {', '.join(_dotted(item.path) for item in found)})")
        self.found = found


class _Literal(str):
    """What a non-finite number parses to inside :func:`loads_strict` (never returned): its text."""


def loads_strict(data: bytes | str) -> Any:
    """Parse ``data`` as JSON, refusing non-finite numbers.

    Raises:
        NonFiniteNumbers: ``NaN``, ``Infinity``, ``-Infinity`` or a number that overflows
            a double; each is located by path (one that a later duplicate key replaced is
            located at the root, ``()``).
        ValueError: anything :func:`json.loads` raises (``json.JSONDecodeError`` included).
    """
    seen: list[_Literal] = []

    def literal(text: str) -> _Literal:
        seen.append(_Literal(text))
        return seen[-1]

    def number(text: str) -> float | _Literal:
        value = float(text)
        return value if math.isfinite(value) else literal(text)

    document = json.loads(data, parse_constant=literal, parse_float=number)
    if not seen:
        return document
    found = [NonFinite(path, str(leaf)) for path, leaf in _leaves(document, lambda v: isinstance(v, _Literal))]
    if len(found) < len(seen):  # a duplicate key dropped some: they were in the body all the same
        found.append(NonFinite((), str(seen[0])))
    raise NonFiniteNumbers(found[:MAX_REPORTED])


def json_value_problems(value: Any) -> list[tuple[JsonPath, str]]:
    """Where the Python ``value`` cannot be sent as strict JSON, and why (at most :data:`MAX_REPORTED`).

    Non-finite floats get :data:`NONFINITE_MESSAGE`; a value of another type than
    ``dict``/``list``/``tuple``/``str``/``int``/``float``/``bool``/``None`` (a YAML date)
    is named by type. Keys are checked as :func:`json.dumps` converts them.
    """
    problems = [(path, _problem(leaf)) for path, leaf in _leaves(value, _not_json, check_keys=True)]
    return problems[:MAX_REPORTED]


def _not_json(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    return not isinstance(value, (str, int, bool, type(None), dict, list, tuple))


def _problem(value: Any) -> str:
    if isinstance(value, float):
        return NONFINITE_MESSAGE
    return f"a {type(value).__name__} is not a JSON value: write it as a string or a number"


def _leaves(root: Any, matches: Callable[[Any], bool], *, check_keys: bool = False) -> Iterator[tuple[JsonPath, Any]]:
    """``(path, value)`` of every value under ``root`` that ``matches``, in document order, without recursion."""
    pending: list[tuple[JsonPath, Any]] = [((), root)]
    while pending:
        path, node = pending.pop()
        if matches(node):
            yield path, node
        elif isinstance(node, dict):
            if check_keys:
                yield from (((*path, str(key)), key) for key in node if matches(key))
            pending.extend(reversed([((*path, str(key)), child) for key, child in node.items()]))
        elif isinstance(node, (list, tuple)):
            pending.extend(reversed([((*path, index), child) for index, child in enumerate(node)]))


def _dotted(path: JsonPath) -> str:
    """``loss_scale.init_scale``, ``hidden_sizes[0]``; the root is ``(body)``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "(body)"
