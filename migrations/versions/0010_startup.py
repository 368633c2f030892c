"""The start-up phases of a job's current attempt.

Adds ``jobs.startup`` (JSON, null until the attempt's trainer reported its first start-up
phase; cleared by every claim): the newest ``phase`` record of the attempt, ``{"phase",
"launch_s", "imports_s", "data_s", "model_s", "first_step_s"}`` (``worker/phase_record.py``).
The job resource derives its ``phase`` and ``startup`` from it.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``jobs.startup`` (null: no start-up phase reported yet)."""
    op.add_column("jobs", sa.Column("startup", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop the column."""
    op.drop_column("jobs", "startup")
