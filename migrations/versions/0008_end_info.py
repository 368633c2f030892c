"""What a succeeded run's ``end`` record said.

Adds ``jobs.end_info`` (JSON, null until a run succeeded): the ``end`` record's counts
(``steps``, ``skipped_steps``, ``applied_steps``), and ``stopped_early`` (early stopping
ended the job before ``max_steps``) and ``exported_step`` (the step whose weights the
exports hold, with ``keep_best``) when the record has them. The job resource shows the
last two.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``jobs.end_info`` (null: no run of the job has succeeded)."""
    op.add_column("jobs", sa.Column("end_info", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop the column."""
    op.drop_column("jobs", "end_info")
