"""Response bodies of ``GET /workers`` (the worker roster)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from halfcast.common.timeutil import as_utc
from halfcast.core.db.workers import WorkerState


class WorkerPublic(BaseModel):
    """A registered worker: identity, GPUs, CPU concurrency, heartbeat, and its jobs that are not terminal."""

    id: str = Field(description="<celery hostname>/<pid>: the worker_id of its jobs' attempts")
    hostname: str = Field(description="The host it runs on")
    pid: int
    gpus: list[int] = Field(description="GPU indices on the host it hands to jobs ([] for a CPU-only worker)")
    concurrency: int = Field(description="CPU jobs it runs at once")
    started_at: datetime
    heartbeat_at: datetime = Field(description="Its last heartbeat (UTC)")
    live: bool = Field(description="Its last heartbeat is younger than HALFCAST_WORKER_LIVE_S")
    running_jobs: list[str] = Field(description="Ids of its jobs in starting, running or cancelling, oldest first")

    @classmethod
    def from_state(cls, state: WorkerState) -> WorkerPublic:
        """Build from a roster row and what the API derived from it."""
        row = state.row
        return cls(
            id=row.id,
            hostname=row.hostname,
            pid=row.pid,
            gpus=list(row.gpus or []),
            concurrency=row.concurrency,
            started_at=as_utc(row.started_at),
            heartbeat_at=as_utc(row.heartbeat_at),
            live=state.live,
            running_jobs=list(state.running_jobs),
        )


class WorkerList(BaseModel):
    """``GET /workers``: registered workers by id (those silent for over HALFCAST_WORKER_FORGET_S are left out)."""

    workers: list[WorkerPublic]
