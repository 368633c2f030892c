"""Fixtures for end-to-end tests: the embedded stack and the Postgres + Redis stack (see e2e_support)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from database_support import fresh_database
from e2e_support import Stack, stack_environment

log = logging.getLogger("e2e")


def make_stack(data_dir: Path, workers: int = 1, **settings: str) -> Iterator[Stack]:
    """Start a stack (with ``workers`` worker processes); stop it afterwards and log every process's output."""
    stack = Stack(data_dir, stack_environment(data_dir, **settings), workers=workers).start()
    try:
        yield stack
    finally:
        stack.stop()
        for name in stack.processes:
            log.info("---- %s log (tail) ----\n%s", name, stack.log_tail(name, 40))


@pytest.fixture(scope="module")
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database per e2e module (overrides the session's): what a module's stacks
    list (jobs, models, datasets, tokens) is that module's alone, whatever ran before it on this worker."""
    yield from fresh_database(postgres_admin_url)


@pytest.fixture(scope="module")
def embedded_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The embedded stack (SQLite + filesystem broker), shared by a module's tests."""
    yield from make_stack(tmp_path_factory.mktemp("embedded"))


@pytest.fixture(scope="module")
def services_stack(tmp_path_factory: pytest.TempPathFactory, postgres_url: str, redis_url: str) -> Iterator[Stack]:
    """The production layout: Postgres (migrated) and Redis, with a queue of its own."""
    yield from make_stack(tmp_path_factory.mktemp("services"), database_url=postgres_url, broker_url=redis_url)
