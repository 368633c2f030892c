"""Where each retried attempt resumed.

Adds ``attempts.resumed_from_step`` (integer, null for a first attempt and for attempts
stored before this revision): the step of the checkpoint a retry resumed from, ``0``
when the earlier attempts left none and it started over. The job resource and the
dashboard's attempts list show it.

``attempts.status`` is a plain string column (no enum or check constraint), so its new
value ``requeued`` (an attempt a graceful worker shutdown handed back) needs no change.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``attempts.resumed_from_step`` (null: a first attempt, or not recorded)."""
    op.add_column("attempts", sa.Column("resumed_from_step", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Drop the column."""
    op.drop_column("attempts", "resumed_from_step")
