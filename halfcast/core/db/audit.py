"""The audit log (``audit_events``): job creation, cancellation and requeueing, token and quota changes,
registered datasets and models created and deleted, with actor and time.

:func:`add_event` only adds the row to the session, so a caller can commit it in
the same transaction as the change it describes; :func:`record` commits it alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from halfcast.core.db.models import AuditEvent, utcnow

#: The audited actions.
ACTIONS = (
    "job.create",
    "job.cancel",
    "job.requeue",
    "token.create",
    "token.revoke",
    "quota.set",
    "quota.clear",
    "dataset.create",
    "dataset.delete",
    "model.create",
    "model.delete",
)


@dataclass(frozen=True)
class AuditPage:
    """One page of audit events, newest first; ``next_cursor`` is ``None`` on the last page."""

    events: Sequence[AuditEvent]
    next_cursor: str | None


class InvalidAuditCursor(ValueError):
    """A cursor that :func:`list_events` did not produce."""


def add_event(
    session: Session, actor: str, action: str, subject: str, details: dict[str, object] | None = None
) -> AuditEvent:
    """Add (not commit) an audit event stamped now (UTC). Raises ``ValueError`` for an unknown ``action``."""
    if action not in ACTIONS:
        raise ValueError(f"unknown audit action {action!r}")
    event = AuditEvent(at=utcnow(), actor=actor, action=action, subject=subject, details=details)
    session.add(event)
    return event


def record(
    session: Session, actor: str, action: str, subject: str, details: dict[str, object] | None = None
) -> AuditEvent:
    """Add an audit event and commit it (see :func:`add_event`)."""
    event = add_event(session, actor, action, subject, details)
    session.commit()
    return event


def list_events(
    session: Session, *, limit: int = 50, cursor: str | None = None, action: str | None = None
) -> AuditPage:
    """Audit events newest first (by id: insertion order), optionally of one ``action``, after ``cursor``.

    Raises :class:`InvalidAuditCursor` for a cursor that is not an event id.
    """
    query = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit + 1)
    if action is not None:
        query = query.where(AuditEvent.action == action)
    if cursor is not None:
        if not (cursor.isascii() and cursor.isdigit()) or len(cursor) > 18:  # "²".isdigit(), but int("²") fails
            raise InvalidAuditCursor(f"invalid cursor {cursor!r}")
        query = query.where(AuditEvent.id < int(cursor))
    events = list(session.scalars(query))
    if len(events) <= limit:
        return AuditPage(events, None)
    return AuditPage(events[:limit], str(events[limit - 1].id))
