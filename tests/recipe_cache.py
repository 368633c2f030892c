"""Tiny models and tokenizers built once per machine and recipe, then copied: heavy work done once.

Every test worker (and every test session) that asks for the same recipe gets a copy of one
directory, built by the first asker under a file lock. A recipe's key hashes its name, its
parameters, the source of the module that builds it and the versions of torch, transformers
and tokenizers, so a changed recipe or library builds anew. The cache lives under
``HALFCAST_TEST_CACHE`` (default: ``halfcast-test-cache`` in the system's temporary
directory); deleting it is always safe.
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

CACHE_ENV = "HALFCAST_TEST_CACHE"
#: Distributions whose versions change what a recipe writes.
_LIBRARIES = ("torch", "transformers", "tokenizers")

Recipe = Callable[..., object]


def cache_root() -> Path:
    """Where built recipes are kept."""
    return Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "halfcast-test-cache")


def recipe_key(name: str, build: Recipe, params: dict[str, Any]) -> str:
    """A hex key of ``name``, ``params``, the source of ``build``'s module and the libraries' versions."""
    source = inspect.getsource(sys.modules[build.__module__])
    versions = {library: _version(library) for library in _LIBRARIES}
    text = json.dumps([name, build.__qualname__, params, source, versions], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def built(name: str, build: Recipe, **params: Any) -> Path:
    """The directory ``build(directory, **params)`` wrote, built once per key (see the module docstring)."""
    root = cache_root()
    target = root / f"{name}-{recipe_key(name, build, params)}"
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(f"{target.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker building the same recipe: wait for it
        if not target.is_dir():
            staging = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}-"))
            try:
                build(staging, **params)
                staging.rename(target)  # whole or not at all
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return target


def copy_built(name: str, build: Recipe, directory: Path, **params: Any) -> Path:
    """A fresh copy of :func:`built`'s directory at ``directory`` (returned); the test may change it freely."""
    shutil.copytree(built(name, build, **params), directory, dirs_exist_ok=True)
    return directory


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
