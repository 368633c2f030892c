"""Isolation: a job, a registered dataset or model is visible to its owner and to admins; to anyone else it does not exist."""

from __future__ import annotations

from typing import TypeVar

from fastapi import Request
from sqlalchemy.orm import Session

from halfcast.core.db import jobs as repo
from halfcast.core.db.models import Job, RegisteredDataset, RegisteredModel
from server.auth import Principal, can_see
from server.http.errors import ApiError


def visible_job_or_404(session: Session, job_id: str, principal: Principal) -> Job:
    """The job, if ``principal`` may see it; else ``ApiError`` 404, the same answer as for a missing job."""
    try:
        job = repo.get_job(session, job_id)
    except repo.JobNotFound:
        job = None
    if job is None or not can_see(principal, job):
        raise ApiError(404, f"job {job_id} not found", job_id=job_id)
    return job


def visible_job_for_files(request: Request, job_id: str, principal: Principal) -> Job:
    """:func:`visible_job_or_404` in a session of its own, closed before the route reads any file."""
    with request.app.state.session_factory() as session:
        return visible_job_or_404(session, job_id, principal)


def owner_visible(principal: Principal, owner: str | None) -> bool:
    """Whether ``principal`` may see what ``owner`` owns: its owner, or any admin."""
    return principal.admin or (owner is not None and owner == principal.owner)


Registered = TypeVar("Registered", bound=RegisteredDataset | RegisteredModel)


def visible_registered_or_404(row: Registered | None, kind: str, item_id: str, principal: Principal) -> Registered:
    """``row`` (a ``kind``: dataset or model) if ``principal`` may see it; else ``ApiError`` 404, as for a missing one."""
    if row is None or not owner_visible(principal, row.owner):
        raise ApiError(404, f"{kind} {item_id} not found")
    return row


def visible_dataset_or_404(row: RegisteredDataset | None, dataset_id: str, principal: Principal) -> RegisteredDataset:
    """``row`` if ``principal`` may see it; else ``ApiError`` 404, as for a dataset that does not exist."""
    return visible_registered_or_404(row, "dataset", dataset_id, principal)


def visible_model_or_404(row: RegisteredModel | None, model_id: str, principal: Principal) -> RegisteredModel:
    """``row`` if ``principal`` may see it; else ``ApiError`` 404, as for a model that does not exist."""
    return visible_registered_or_404(row, "model", model_id, principal)
