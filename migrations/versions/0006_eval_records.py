"""Every evaluation of a job, not only the newest.

Creates ``eval_records`` (one row per ``(job_id, step)``, the record in ``data``, like
``step_records``) and copies each job's stored newest evaluation (``jobs.eval``) into
it, so jobs evaluated before this migration keep what they had.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``eval_records`` and fill it with every job's newest evaluation."""
    eval_records = op.create_table(
        "eval_records",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "step"),
    )
    jobs = sa.table("jobs", sa.column("id", sa.String()), sa.column("eval", sa.JSON()))
    rows = [
        {"job_id": job_id, "step": int(record["step"]), "time": float(record.get("time") or 0.0), "data": record}
        for job_id, record in op.get_bind().execute(sa.select(jobs.c.id, jobs.c.eval))
        if isinstance(record, dict) and isinstance(record.get("step"), int)
    ]
    if rows:
        op.bulk_insert(eval_records, rows)


def downgrade() -> None:
    """Drop ``eval_records`` (``jobs.eval`` still holds each job's newest evaluation)."""
    op.drop_table("eval_records")
