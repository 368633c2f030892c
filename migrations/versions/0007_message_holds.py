"""Which worker holds a queued job's broker message.

Adds ``jobs.held_by`` (the worker id ``<hostname>/<pid>`` whose task took the job's
message and has not yet claimed the job or handed the message back) and
``jobs.held_at`` (when it took it). A queued job whose holder stopped heartbeating
is sent again by the reapers (``worker/messages/holds.py``), instead of waiting for Redis's
visibility timeout.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``jobs.held_by`` and ``jobs.held_at`` (null: no worker holds the job's message)."""
    op.add_column("jobs", sa.Column("held_by", sa.String(length=255), nullable=True))
    op.add_column("jobs", sa.Column("held_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    """Drop the two columns."""
    op.drop_column("jobs", "held_at")
    op.drop_column("jobs", "held_by")
