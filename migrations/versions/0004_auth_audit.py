"""Authentication, job owners and the audit log.

Creates ``api_tokens`` (bearer tokens: owner, admin flag, the SHA-256 of the secret,
created/revoked/last-used times) and ``audit_events`` (who did what to which job or
token, and when). Adds ``jobs.owner`` (the owner of the token that created the job;
left null for existing jobs, which then only admins see) and scopes idempotency keys
per owner: the unique index on ``idempotency_key`` becomes one on
``(owner, idempotency_key)``.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-07 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``api_tokens`` and ``audit_events``; add ``jobs.owner``; scope idempotency keys per owner."""
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=False),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_index("ix_api_tokens_owner", "api_tokens", ["owner"])
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("subject", sa.String(length=255), nullable=False),
        sa.Column("details", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_audit_events_at", "audit_events", ["at"])
    op.create_index("ix_audit_events_action", "audit_events", ["action"])
    # plain ALTER TABLE, never a batch copy (a copy of ``jobs`` would cascade-delete step records on SQLite)
    op.add_column("jobs", sa.Column("owner", sa.String(length=255), nullable=True))
    op.drop_index("ix_jobs_idempotency_key", table_name="jobs")
    op.create_index("ix_jobs_owner_idempotency_key", "jobs", ["owner", "idempotency_key"], unique=True)
    op.create_index("ix_jobs_owner_created", "jobs", ["owner", "created_at"])


def downgrade() -> None:
    """Drop what :func:`upgrade` added; fails if two owners used the same idempotency key."""
    op.drop_index("ix_jobs_owner_created", table_name="jobs")
    op.drop_index("ix_jobs_owner_idempotency_key", table_name="jobs")
    op.create_index("ix_jobs_idempotency_key", "jobs", ["idempotency_key"], unique=True)
    op.drop_column("jobs", "owner")  # SQLite >= 3.35 drops a column in place
    op.drop_index("ix_audit_events_action", table_name="audit_events")
    op.drop_index("ix_audit_events_at", table_name="audit_events")
    op.drop_table("audit_events")
    op.drop_index("ix_api_tokens_owner", table_name="api_tokens")
    op.drop_table("api_tokens")
