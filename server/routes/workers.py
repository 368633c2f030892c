"""``/workers``: the worker registry (who is there, with which GPUs, running what, heard from when)."""

from __future__ import annotations

from fastapi import APIRouter

from server.db.models import utcnow
from server.db.workers import list_workers
from server.deps import SessionDep, SettingsDep
from server.worker_schemas import WorkerList, WorkerPublic

router = APIRouter(prefix="/workers", tags=["workers"])


@router.get("", response_model=WorkerList)
def get_workers(session: SessionDep, settings: SettingsDep) -> WorkerList:
    """Registered workers by id, with ``live`` and the ids of their jobs that are not terminal."""
    states = list_workers(session, utcnow(), settings.worker_live_s, settings.worker_forget_s)
    return WorkerList(workers=[WorkerPublic.from_state(state) for state in states])
