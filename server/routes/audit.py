"""``GET /audit``: the audit log (job creation and cancellation, token changes), newest first; admins only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.exceptions import RequestValidationError

from halfcast.common.timeutil import as_utc
from halfcast.contracts.access import AuditAction, AuditEventPublic, AuditList
from halfcast.core.db import audit
from halfcast.core.db.models import AuditEvent
from server.auth import require_admin
from server.deps import SessionDep

router = APIRouter(prefix="/audit", tags=["audit"], dependencies=[Depends(require_admin)])


def audit_event_public(row: AuditEvent) -> AuditEventPublic:
    """The public form of a stored event."""
    return AuditEventPublic(
        id=row.id,
        at=as_utc(row.at),
        actor=row.actor,
        action=row.action,
        subject=row.subject,
        details=row.details,
    )


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
    return AuditList(events=[audit_event_public(row) for row in page.events], next_cursor=page.next_cursor)
