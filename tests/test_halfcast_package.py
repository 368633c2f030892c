"""``import halfcast``: the client and what it answers, importable from the package, each name on first use
(issue 30 item 1)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import halfcast
from halfcast.client import HalfcastClient

ROOT = Path(__file__).resolve().parents[1]


def test_the_client_is_importable_from_the_package() -> None:
    from halfcast import Client, ValidationFailed

    assert Client is HalfcastClient
    assert issubclass(ValidationFailed, halfcast.HalfcastError)


def test_every_exported_name_is_the_one_its_module_defines() -> None:
    assert sorted(halfcast.__all__) == sorted(halfcast.EXPORTS)
    for name, (module, attribute) in halfcast.EXPORTS.items():
        assert getattr(halfcast, name) is getattr(importlib.import_module(module), attribute), name


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Clinet'"):
        halfcast.Clinet  # noqa: B018  # the lookup is what is tested


def test_importing_the_contracts_loads_no_http_client() -> None:
    """What a trainer rank imports (``halfcast.contracts``) does not pull the client in through the package."""
    code = (
        "import json, sys; import halfcast.contracts.records, halfcast.common.redact; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('httpx', 'halfcast'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    loaded = json.loads(out)
    assert "httpx" not in loaded and "halfcast.client" not in loaded
    assert "halfcast.contracts.records" in loaded
