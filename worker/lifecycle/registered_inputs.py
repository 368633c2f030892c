"""Before each attempt: the references a job's spec holds, checked for the job's owner and filled into the run's spec copy.

The stored spec keeps what was submitted (``dataset_id``, ``model_id``, ``resume_from``); the copy
the worker writes as ``spec.json`` gets the registered dataset's ``format``, ``file_format`` and
``sha256`` (:func:`halfcast.core.registry.refs.resolve_refs`), which the trainer needs to find the file
and check it. The API checked at submission that the caller may read every reference; the worker
checks again, before it opens anything, with the rights of the job's owner: what it owns, or
anything when it holds an unrevoked admin token (an admin's job may name other owners' inputs,
docs/api.md). A reference deleted since the submission, or no longer the owner's to read, fails
the attempt with ``data_unavailable``, ``model_unavailable`` or ``checkpoint_unavailable``
(:class:`~halfcast.core.registry.refs.RefError`'s ``reason``).
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine, exists, select

from halfcast.core.db.engine import read_connection
from halfcast.core.db.models import ApiToken, Job
from halfcast.core.registry.refs import RefError, Visible, names_registered_inputs, resolve_refs

__all__ = ["RefError", "resolve_inputs"]


def _holds_admin_token(conn: Connection, owner: str) -> bool:
    admin = select(ApiToken.id).where(ApiToken.owner == owner, ApiToken.admin, ApiToken.revoked_at.is_(None))
    return bool(conn.execute(select(exists(admin))).scalar())


def _job_owner_reads(conn: Connection, job_id: str) -> Visible:
    """What the owner of job ``job_id`` may read: its own things, or everything for an admin."""
    owner = conn.execute(select(Job.owner).where(Job.id == job_id)).scalar_one_or_none()
    if owner is not None and _holds_admin_token(conn, owner):
        return lambda _owner: True
    return lambda referenced: owner is not None and referenced == owner


def resolve_inputs(engine: Engine, job_id: str, spec: dict[str, object]) -> dict[str, object]:
    """Job ``job_id``'s ``spec`` with its registered inputs filled in (itself when it holds no reference).

    Raises:
        RefError: a reference names nothing the job's owner may read (or nothing at all).
    """
    if not names_registered_inputs(spec):
        return spec
    with read_connection(engine) as conn:
        return resolve_refs(conn, spec, _job_owner_reads(conn, job_id))
