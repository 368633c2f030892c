"""Bounds on a spec file read by the CLI, so a hostile or broken file fails fast with a clear message.

A spec the API would take fits in its request body limit (:data:`halfcast.contracts.limits.MAX_BODY_BYTES`),
so a larger file is refused before parsing. YAML aliases make a small file stand for
a huge document ("billion laughs": each alias is a shared reference when parsed, but
sending the spec writes every copy out), so the parsed value is walked, aliases
counted at each use, and refused beyond :data:`MAX_SPEC_NODES`. A value nested too
deeply for the parsers' recursion is refused too (the caller catches ``RecursionError``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from halfcast.contracts.limits import MAX_BODY_BYTES

#: Largest spec file read, in bytes (the API's request body limit).
MAX_SPEC_BYTES = MAX_BODY_BYTES
#: Most values (mappings, lists, scalars, keys) a spec may expand to, aliases counted at each use.
MAX_SPEC_NODES = 1_000_000


class SpecTooLarge(ValueError):
    """The spec file or the document it expands to is over a limit."""


def read_spec_text(source: str) -> str:
    """The text of ``source`` (a path, or ``-`` for stdin), at most :data:`MAX_SPEC_BYTES` bytes of UTF-8.

    Raises ``OSError`` when the file cannot be read, :class:`SpecTooLarge` when it is
    larger, ``UnicodeDecodeError`` (a ``ValueError``) when it is not UTF-8.
    """
    if source == "-":
        data = sys.stdin.read(MAX_SPEC_BYTES + 1)
        raw = data.encode("utf-8", errors="surrogateescape") if isinstance(data, str) else data
    else:
        with Path(source).open("rb") as handle:
            raw = handle.read(MAX_SPEC_BYTES + 1)
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecTooLarge(f"{source} is larger than {MAX_SPEC_BYTES} bytes, the most a spec may be")
    return raw.decode("utf-8")


def check_expansion(value: Any, source: str) -> None:
    """Raise :class:`SpecTooLarge` when ``value`` expands to more than :data:`MAX_SPEC_NODES` values.

    Walks without recursion and stops at the limit, so a "billion laughs" document is
    refused in well under a second.
    """
    pending = [value]
    count = 0
    while pending:
        node = pending.pop()
        count += 1
        if count > MAX_SPEC_NODES:
            raise SpecTooLarge(
                f"{source} expands to more than {MAX_SPEC_NODES} values (YAML aliases repeat what they point to)"
            )
        if isinstance(node, dict):
            pending.extend(node.keys())
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
