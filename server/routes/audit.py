"""``GET /audit``: the audit log (job creation and cancellation, token changes), newest first; admins only."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field

from common.timeutil import as_utc
from server.auth import require_admin
from server.db import audit
from server.db.models import AuditEvent
from server.deps import SessionDep

router = APIRouter(prefix="/audit", tags=["audit"], dependencies=[Depends(require_admin)])

AuditAction = Literal[
    "job.create", "job.cancel", "job.requeue", "token.create", "token.revoke", "quota.set", "quota.clear",
    "dataset.create", "dataset.delete", "model.create", "model.delete",
]


class AuditEventPublic(BaseModel):
    """One audited action."""

    id: int
    at: datetime = Field(description="When (UTC)")
    actor: str = Field(description="Owner of the token that acted, or `cli:<os user>` for operator commands")
    action: AuditAction
    subject: str = Field(description="The job id, the token id, or the owner (quota changes)")
    details: dict[str, Any] | None = Field(description="e.g. the job's owner, the token's owner and admin flag")

    @classmethod
    def from_row(cls, row: AuditEvent) -> AuditEventPublic:
        """The public form of a stored event."""
        return cls(id=row.id, at=as_utc(row.at), actor=row.actor, action=row.action,  # type: ignore[arg-type]
                   subject=row.subject, details=row.details)  # fmt: skip


class AuditList(BaseModel):
    """A page of audit events, newest first; pass ``next_cursor`` back as ``cursor`` (null: last page)."""

    events: list[AuditEventPublic]
    next_cursor: str | None


@router.get("", response_model=AuditList)
def list_audit(
    session: SessionDep,
    action: Annotated[AuditAction | None, Query(description="Only events of this action")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: Annotated[str | None, Query(max_length=32, description="next_cursor of the previous page")] = None,
) -> AuditList:
    """Audit events, newest first."""
    try:
        page = audit.list_events(session, limit=limit, cursor=cursor, action=action)
    except audit.InvalidAuditCursor as exc:
        raise RequestValidationError(
            [{"type": "value_error", "loc": ("query", "cursor"), "msg": str(exc), "input": cursor}]
        ) from None
    return AuditList(events=[AuditEventPublic.from_row(row) for row in page.events], next_cursor=page.next_cursor)
