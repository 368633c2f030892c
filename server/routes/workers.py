"""``/workers``: the worker roster (who is there, with which GPUs, running what, heard from when).

Any token may read it; ``running_jobs`` names only the caller's jobs unless the caller is an admin.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from halfcast.core.db.models import utcnow
from halfcast.core.db.workers import list_workers
from server.auth import PrincipalDep, authenticate
from server.deps import SessionDep, SettingsDep
from server.worker_schemas import WorkerList, WorkerPublic

router = APIRouter(prefix="/workers", tags=["workers"], dependencies=[Depends(authenticate)])


@router.get("", response_model=WorkerList)
def get_workers(session: SessionDep, settings: SettingsDep, principal: PrincipalDep) -> WorkerList:
    """Registered workers by id, with ``live`` and the ids of their jobs (the caller's, for a non-admin) not terminal."""
    owner = None if principal.admin else principal.owner
    states = list_workers(session, utcnow(), settings.worker_live_s, settings.worker_forget_s, owner=owner)
    return WorkerList(workers=[WorkerPublic.from_state(state) for state in states])
