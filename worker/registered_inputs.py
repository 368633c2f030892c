"""Before each attempt: the registered dataset and model a job names, looked up and filled into the run's spec copy.

The stored spec keeps what was submitted (``dataset_id``, ``model_id``); the copy the worker
writes as ``spec.json`` gets the registered dataset's ``format``, ``file_format`` and ``sha256``
(:func:`server.registry.refs.resolve_refs`), which the trainer needs to find the file and check
it. A dataset or model deleted since the submission fails the attempt with ``data_unavailable``
or ``model_unavailable`` (:class:`~server.registry.refs.RefError`'s ``reason``). The API checked
that the job's owner may use them; the worker only checks that they still exist.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from server.db.engine import read_connection
from server.registry.refs import RefError, names_registered_inputs, resolve_refs

__all__ = ["RefError", "resolve_inputs"]


def resolve_inputs(engine: Engine, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with its registered inputs filled in (itself when it names none); raises :class:`RefError`."""
    if not names_registered_inputs(spec):
        return spec
    with read_connection(engine) as conn:
        return resolve_refs(conn, spec, lambda _owner: True)
