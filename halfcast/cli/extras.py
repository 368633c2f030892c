"""Which extras of ``pyproject.toml`` a command needs, and a clear stop when this install lacks one.

``pip install halfcast`` installs the Python client and the job commands only (httpx,
PyYAML, rich). The API and the operator commands need the ``server`` extra, a worker
the ``worker`` extra (which brings the ``trainer`` one, torch included), ``halfcast up``
both (``pip install 'halfcast[all]'``; ``make up`` installs them all). Before a command's
module is imported, :func:`missing_extras` looks for the modules of each extra it needs,
without importing any, so a client-only install answers ``halfcast api`` with the pip
command to run instead of an ``ImportError`` traceback.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

#: The top-level modules each extra installs (every requirement of the extra in pyproject.toml, by its import name).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "server": ("fastapi", "fastapi_offline", "uvicorn", "httptools", "uvloop", "sqlalchemy", "alembic", "psycopg",
               "pydantic", "pydantic_settings", "prometheus_client", "celery", "redis"),
    "worker": ("celery", "redis", "sqlalchemy", "psycopg", "pydantic", "pydantic_settings", "setproctitle"),
    "trainer": ("torch", "pydantic", "sklearn", "transformers", "peft", "safetensors", "tokenizers"),
}  # fmt: skip  # a table, laid out by hand
#: How many missing modules the error names (then "and N more").
SHOWN_MODULES = 3
#: Extras that bring others with them (pyproject.toml's ``halfcast[...]`` requirements).
EXTRA_INCLUDES: dict[str, tuple[str, ...]] = {"worker": ("trainer",)}


def installed(module: str) -> bool:
    """Whether the top-level ``module`` can be imported here (looked up, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # an import hook that refuses the module
        return False


def expand(extras: Iterable[str]) -> list[str]:
    """``extras`` and every extra they bring, each once, in order."""
    result: list[str] = []
    for extra in extras:
        for name in (extra, *expand(EXTRA_INCLUDES.get(extra, ()))):
            if name not in result:
                result.append(name)
    return result


def missing_extras(extras: Iterable[str]) -> dict[str, list[str]]:
    """For each extra ``extras`` needs (with the ones they bring) that this install lacks: its missing modules."""
    missing = {extra: [m for m in EXTRA_MODULES[extra] if not installed(m)] for extra in expand(extras)}
    return {extra: modules for extra, modules in missing.items() if modules}


def missing_extra_message(command: str, extras: Iterable[str], missing: dict[str, list[str]]) -> str:
    """One line: ``halfcast <command>`` needs ``extras``, the first missing modules, and the pip command to run."""
    wanted = list(extras)
    named = " and ".join(f"the {extra} extra" for extra in wanted)
    modules = list(dict.fromkeys(module for names in missing.values() for module in names))
    shown = ", ".join(modules[:SHOWN_MODULES])
    if len(modules) > SHOWN_MODULES:
        shown += f" and {len(modules) - SHOWN_MODULES} more"
    return f"error: halfcast {command} needs {named} (missing: {shown}): pip install 'halfcast[{','.join(wanted)}]'"
