"""Who a token is and what was done with tokens (``GET /session``, ``GET /audit``), as the API answers them.

The routes (:mod:`server.routes.session`, :mod:`server.routes.audit`) answer these models and
:class:`halfcast.client.HalfcastClient` returns them (``whoami``, ``audit``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

#: Every action the audit log records.
AuditAction = Literal[
    "job.create", "job.cancel", "job.requeue", "token.create", "token.revoke", "quota.set", "quota.clear",
    "dataset.create", "dataset.delete", "model.create", "model.delete",
]  # fmt: skip  # the actions a line per kind of resource


class SessionPublic(BaseModel):
    """Who the token belongs to."""

    owner: str
    admin: bool


class AuditEventPublic(BaseModel):
    """One audited action."""

    id: int
    at: datetime = Field(description="When (UTC)")
    actor: str = Field(description="Owner of the token that acted, or `cli:<os user>` for operator commands")
    action: AuditAction
    subject: str = Field(description="The job id, the token id, or the owner (quota changes)")
    details: dict[str, object] | None = Field(description="e.g. the job's owner, the token's owner and admin flag")


class AuditList(BaseModel):
    """A page of audit events, newest first; pass ``next_cursor`` back as ``cursor`` (null: last page)."""

    events: list[AuditEventPublic]
    next_cursor: str | None
