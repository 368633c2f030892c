"""Per-owner submission quotas.

Creates ``owner_quotas``: one row per owner with its own limits (``max_active_jobs``,
``max_gpus``, ``max_queued_jobs``; null means "the server's default",
``HALFCAST_QUOTA_*``) and when they were last set. Adds the index
``ix_jobs_owner_status`` on ``jobs (owner, status)``, which the quota check at
submission counts through.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-14 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``owner_quotas`` and the index ``ix_jobs_owner_status``."""
    op.create_table(
        "owner_quotas",
        sa.Column("owner", sa.String(length=255), nullable=False),
        sa.Column("max_active_jobs", sa.Integer(), nullable=True),
        sa.Column("max_gpus", sa.Integer(), nullable=True),
        sa.Column("max_queued_jobs", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("owner"),
    )
    op.create_index("ix_jobs_owner_status", "jobs", ["owner", "status"])


def downgrade() -> None:
    """Drop what :func:`upgrade` added (every owner's quota overrides are lost)."""
    op.drop_index("ix_jobs_owner_status", table_name="jobs")
    op.drop_table("owner_quotas")
