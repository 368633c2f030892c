"""Submission check: a model or data path some registered worker's roots can hold (else 422 at that field).

Workers report their model and data roots with their heartbeat (``workers.model_roots``,
``workers.data_roots``). A job naming a path under a root (an ``hf`` model's ``path`` or
``tokenizer_path``, a ``jsonl`` dataset's ``path``) is refused at submission when:

- no registered worker reports a root of that kind (the job could only fail
  ``model_unavailable``/``data_unavailable: no ... roots are configured``), or
- every such root is a directory this API's host sees (one host, or a shared volume) and none
  holds the path.

Roots the API cannot see (a worker on another host) are not judged: the worker decides at run
time. Registered means heartbeat within ``HALFCAST_WORKER_FORGET_S``, as for GPU capacity
(:mod:`server.capacity`); with no registered worker, or only workers that do not report roots
(older ones), nothing is refused: the job waits in the queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from halfcast.contracts.spec import JobSpec
from halfcast.core.db.models import Worker, utcnow
from halfcast.core.settings import Settings
from server.http.errors import ErrorItem

RootKind = Literal["model", "data"]


@dataclass(frozen=True)
class RootedPath:
    """A path of the spec read under a root: where it is (``loc``), which kind of root, the path."""

    loc: tuple[str, ...]
    kind: RootKind
    path: str


def rooted_paths(spec: JobSpec) -> list[RootedPath]:
    """The paths ``spec`` reads under model or data roots (registered ids are not paths)."""
    found = []
    config: Any = spec.model.config
    if spec.model.name == "hf":
        for name in ("path", "tokenizer_path"):
            if getattr(config, name) is not None:
                found.append(RootedPath(("body", "model", "config", name), "model", getattr(config, name)))
    dataset: Any = spec.dataset.config
    if spec.dataset.name == "jsonl" and dataset.path is not None:
        found.append(RootedPath(("body", "dataset", "config", "path"), "data", dataset.path))
    return found


def reported_roots(session: Session, settings: Settings) -> dict[RootKind, list[str]] | None:
    """The model and data roots registered workers report (``None``: no registered worker reports any)."""
    since = utcnow() - timedelta(seconds=settings.worker_forget_s)
    rows = session.execute(select(Worker.model_roots, Worker.data_roots).where(Worker.heartbeat_at >= since)).all()
    reporting = [row for row in rows if row.model_roots is not None and row.data_roots is not None]
    if not reporting:
        return None
    return {
        "model": sorted({root for row in reporting for root in row.model_roots}),
        "data": sorted({root for row in reporting for root in row.data_roots}),
    }


def input_root_errors(spec: JobSpec, roots: dict[RootKind, list[str]] | None) -> list[ErrorItem]:
    """The 422 items of ``spec``'s paths none of the reported ``roots`` can hold (see the module docstring)."""
    if roots is None:
        return []
    return [error for rooted in rooted_paths(spec) if (error := _error(rooted, roots[rooted.kind])) is not None]


def _error(rooted: RootedPath, roots: list[str]) -> ErrorItem | None:
    variable = f"HALFCAST_{rooted.kind.upper()}_ROOTS"
    if not roots:
        msg = f"no worker has {rooted.kind} roots configured ({variable}), so no worker can read {rooted.path!r}"
    elif all(Path(root).is_dir() for root in roots) and not any((Path(root) / rooted.path).exists() for root in roots):
        msg = f"{rooted.path!r} is under none of the workers' {rooted.kind} roots ({variable})"
    else:
        return None
    return {"type": "value_error", "loc": rooted.loc, "msg": msg, "input": rooted.path}
