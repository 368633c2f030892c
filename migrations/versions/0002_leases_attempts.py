"""Leases, attempts and idempotency keys.

Adds to ``jobs`` the lease expiry of the current attempt, the ``Idempotency-Key`` of
the creating request (unique) and the hash of its spec, and creates ``attempts``: one
row per launch attempt (worker, start, end, outcome). Existing claimed jobs get one
row for their latest attempt, so the job resource shows it.

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the lease and idempotency columns, the ``attempts`` table, and backfill it."""
    # plain ALTER TABLE, never a batch copy: on SQLite a copy would drop ``jobs`` and,
    # with foreign keys on, cascade-delete every step record
    op.add_column("jobs", sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("idempotency_key", sa.String(length=255), nullable=True))
    op.add_column("jobs", sa.Column("request_hash", sa.String(length=64), nullable=True))
    op.create_index("ix_jobs_idempotency_key", "jobs", ["idempotency_key"], unique=True)
    op.create_table(
        "attempts",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=255), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=True),
        sa.Column("reason", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "attempt"),
    )
    op.execute(
        "INSERT INTO attempts (job_id, attempt, worker_id, started_at, ended_at, status, reason) "
        "SELECT id, attempt, COALESCE(worker_id, 'unknown'), COALESCE(started_at, created_at), finished_at, "
        "CASE WHEN status IN ('succeeded', 'failed', 'cancelled') THEN status END, error_reason "
        "FROM jobs WHERE attempt > 0"
    )


def downgrade() -> None:
    """Drop ``attempts`` and the new ``jobs`` columns."""
    op.drop_table("attempts")
    op.drop_index("ix_jobs_idempotency_key", table_name="jobs")
    for column in ("request_hash", "idempotency_key", "lease_expires_at"):
        op.drop_column("jobs", column)  # SQLite >= 3.35 drops a column in place
