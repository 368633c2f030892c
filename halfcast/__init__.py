"""Halfcast: training as a service. ``from halfcast import Client`` is the Python client of its HTTP API.

>>> from halfcast import Client
>>> with Client("http://127.0.0.1:8000", token="...") as halfcast:  # doctest: +SKIP
...     job = halfcast.submit({"model": {"name": "mlp"}, "dataset": {"name": "digits"}})
...     for event in halfcast.events(job.id):
...         print(event.event, event.data)

The client (:mod:`halfcast.client`), its typed errors (:mod:`halfcast.errors`) and the records it answers
(:mod:`halfcast.contracts`) are importable from here; each is imported on first use, so
``import halfcast.contracts`` (what a trainer rank does) pulls in no HTTP client.

The subpackages, by who uses them:

- the client and the CLI's job commands: :mod:`halfcast.client`, :mod:`halfcast.errors`, :mod:`halfcast.sse`,
  :mod:`halfcast.files` (downloads, export archives), :mod:`halfcast.cli` (the ``halfcast`` command);
- every package: :mod:`halfcast.contracts` (what flows between them) and :mod:`halfcast.common` (helpers);
- the server and the worker: :mod:`halfcast.core` (settings, the database, the data directory, the Celery app).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from halfcast.client import HalfcastClient
    from halfcast.client import HalfcastClient as Client
    from halfcast.contracts.artifacts import CheckpointPublic, ExportPublic
    from halfcast.contracts.registry import DatasetPublic, ModelPublic
    from halfcast.contracts.resources import JobList, JobPublic, LogLines
    from halfcast.contracts.status import FailureReason, JobStatus
    from halfcast.contracts.stored import StoredEval, StoredStep
    from halfcast.errors import (
        Conflict,
        FieldError,
        Forbidden,
        HalfcastError,
        NotFound,
        QuotaExceeded,
        ServerUnavailable,
        Unauthorized,
        ValidationFailed,
    )
    from halfcast.sse import Event

#: Each name importable from ``halfcast``: (module, name in that module).
EXPORTS: dict[str, tuple[str, str]] = {
    "Client": ("halfcast.client", "HalfcastClient"),
    "HalfcastClient": ("halfcast.client", "HalfcastClient"),
    "Event": ("halfcast.sse", "Event"),
    **{
        name: ("halfcast.errors", name)
        for name in (
            "Conflict",
            "FieldError",
            "Forbidden",
            "HalfcastError",
            "NotFound",
            "QuotaExceeded",
            "ServerUnavailable",
            "Unauthorized",
            "ValidationFailed",
        )
    },
    "CheckpointPublic": ("halfcast.contracts.artifacts", "CheckpointPublic"),
    "ExportPublic": ("halfcast.contracts.artifacts", "ExportPublic"),
    "DatasetPublic": ("halfcast.contracts.registry", "DatasetPublic"),
    "ModelPublic": ("halfcast.contracts.registry", "ModelPublic"),
    "JobList": ("halfcast.contracts.resources", "JobList"),
    "JobPublic": ("halfcast.contracts.resources", "JobPublic"),
    "LogLines": ("halfcast.contracts.resources", "LogLines"),
    "FailureReason": ("halfcast.contracts.status", "FailureReason"),
    "JobStatus": ("halfcast.contracts.status", "JobStatus"),
    "StoredEval": ("halfcast.contracts.stored", "StoredEval"),
    "StoredStep": ("halfcast.contracts.stored", "StoredStep"),
}

__all__ = [
    "CheckpointPublic",
    "Client",
    "Conflict",
    "DatasetPublic",
    "Event",
    "ExportPublic",
    "FailureReason",
    "FieldError",
    "Forbidden",
    "HalfcastClient",
    "HalfcastError",
    "JobList",
    "JobPublic",
    "JobStatus",
    "LogLines",
    "ModelPublic",
    "NotFound",
    "QuotaExceeded",
    "ServerUnavailable",
    "StoredEval",
    "StoredStep",
    "Unauthorized",
    "ValidationFailed",
]


def __getattr__(name: str) -> Any:
    """The exported ``name``, imported from its module on first use (PEP 562)."""
    try:
        module, attribute = EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'halfcast' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *EXPORTS])
