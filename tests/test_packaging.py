"""pyproject.toml's install paths: the client alone, then the extras, as the CLI and the Dockerfile expect them.

``pip install halfcast`` brings the client's own dependencies only; the ``server``,
``worker`` and ``trainer`` extras the rest. :mod:`halfcast.cli.extras` knows each
extra's modules (to stop a command whose extra is missing): here they are checked
against the requirements of pyproject.toml, through the distributions installed in
this environment (which has every extra). That a client-only install runs the job
commands is tests/server/test_cli_imports.py's.
"""

from __future__ import annotations

import importlib.metadata

import pytest
from packaging_support import (
    ROOT,
    client_requirements,
    extras,
    includes,
    normalized,
    own_requirements,
    pyproject,
    resolved,
)

from halfcast.cli import COMMANDS
from halfcast.cli.extras import EXTRA_INCLUDES, EXTRA_MODULES, expand

#: The packages the wheel ships (the benchmarks and the tests stay in the repository).
SHIPPED = {"halfcast", "server", "worker", "trainer", "migrations"}


def test_the_client_brings_only_its_own_dependencies() -> None:
    assert client_requirements() == {
        "httpx",
        "pydantic",
        "pyyaml",
        "rich",
    }  # pydantic: the typed answers (halfcast/contracts/)


def test_all_is_every_extra_and_test_has_all() -> None:
    assert resolved("all") == {"all", "server", "worker", "trainer"}
    assert "all" in includes("test")


@pytest.mark.parametrize("extra", sorted(EXTRA_MODULES))
def test_the_cli_knows_the_modules_of_each_extra(extra: str) -> None:
    """Each module the CLI looks for comes from a requirement of the extra, and each requirement has one."""
    distributions = importlib.metadata.packages_distributions()
    providers = {module: {normalized(d) for d in distributions.get(module, [])} for module in EXTRA_MODULES[extra]}
    assert [module for module, names in providers.items() if not names & own_requirements(extra)] == []
    assert own_requirements(extra) <= set().union(*providers.values())


def test_the_cli_knows_which_extras_bring_others() -> None:
    assert {extra: tuple(included) for extra in EXTRA_MODULES if (included := includes(extra))} == EXTRA_INCLUDES


def test_every_command_extra_is_one_of_pyproject() -> None:
    named = {extra for command in COMMANDS.values() for extra in expand(command.extras)}
    assert named <= set(extras()) and named <= set(EXTRA_MODULES)


def test_the_wheel_and_the_image_hold_every_package() -> None:
    included = {pattern.rstrip("*") for pattern in pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert included == SHIPPED
    copied = {line.split()[1] for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("COPY ")}
    assert copied >= SHIPPED
    assert "RUN pip install '.[all]'" in (ROOT / "Dockerfile").read_text()
