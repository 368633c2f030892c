"""Build ``examples/data/docstring-topics.jsonl``: Python standard-library docstrings labelled by package.

A small, real labelled text set for the MiniLM classification examples, built offline from
the sources of the running Python's standard library (read with :mod:`ast`, never imported).
Each row is ``{"text": ..., "label": ...}``: the first paragraph of one module, class or
function docstring (at least :data:`MIN_WORDS` words, whitespace collapsed, cut at
:data:`MAX_CHARS` characters), labelled with the family of the package it comes from
(:data:`FAMILIES`). Test packages are skipped and duplicate texts are kept once (the first
in sorted file order). Each family contributes at most :data:`PER_LABEL` rows, sampled with
``random.Random(SEED)``; rows are written sorted by label, then text, so the file depends only
on the stdlib sources (the shipped file was built from CPython 3.11.7: another version's
stdlib gives a few different rows).

Usage: ``python examples/build_docstring_topics.py [--out PATH]``.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import random
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("build_docstring_topics")

#: Label -> the standard-library packages whose docstrings carry it.
FAMILIES: dict[str, tuple[str, ...]] = {
    "asyncio": ("asyncio",),
    "email": ("email",),
    "web": ("http", "urllib"),
    "xml": ("xml",),
}
MIN_WORDS = 4
MAX_CHARS = 300
PER_LABEL = 300
SEED = 0
DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "docstring-topics.jsonl"
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def stdlib_dir() -> Path:
    """The running interpreter's standard-library source directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def package_files(stdlib: Path, package: str) -> list[Path]:
    """The ``.py`` files of ``package`` in sorted order, without its test directories."""
    root = stdlib / package
    return [
        p for p in sorted(root.rglob("*.py")) if not any(part.startswith("test") for part in p.relative_to(root).parts)
    ]


def first_paragraph(docstring: str) -> str | None:
    """The docstring's first paragraph, whitespace collapsed and cut to :data:`MAX_CHARS`; ``None`` if too short."""
    paragraph = re.split(r"\n\s*\n", docstring.strip(), maxsplit=1)[0]
    text = " ".join(paragraph.split())[:MAX_CHARS]
    return text if len(text.split()) >= MIN_WORDS else None


def docstrings(path: Path) -> Iterator[str]:
    """The usable first paragraphs of the docstrings in ``path``, in source order (unparsable files: none)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        log.warning("skipping %s: not parsable", path)
        return
    nodes = sorted((n for n in ast.walk(tree) if isinstance(n, _DOCUMENTED)), key=lambda n: getattr(n, "lineno", 0))
    for node in nodes:
        docstring = ast.get_docstring(node)
        text = first_paragraph(docstring) if docstring else None
        if text is not None:
            yield text


def build_rows(stdlib: Path, per_label: int = PER_LABEL, seed: int = SEED) -> list[dict[str, str]]:
    """The labelled rows (see the module docstring), sorted by label then text."""
    rng = random.Random(seed)
    seen: set[str] = set()
    rows: list[dict[str, str]] = []
    for label, packages in FAMILIES.items():
        texts = []
        for package in packages:
            for path in package_files(stdlib, package):
                for text in docstrings(path):
                    if text not in seen:
                        seen.add(text)
                        texts.append(text)
        chosen = rng.sample(texts, min(per_label, len(texts)))
        log.info("label %-8s %4d docstrings, %4d kept", label, len(texts), len(chosen))
        rows.extend({"text": text, "label": label} for text in sorted(chosen))
    return rows


def write_rows(rows: list[dict[str, str]], out: Path) -> None:
    """``rows`` as JSON lines (UTF-8, one object a line) into ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> None:
    """Build the file (``--out``, default ``examples/data/docstring-topics.jsonl``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = build_rows(stdlib_dir())
    write_rows(rows, args.out)
    log.info("wrote %d rows to %s", len(rows), args.out)


if __name__ == "__main__":
    main()
