"""Cancels recorded while the job's row is locked: ``cancel_requests``.

``POST /jobs/{id}/cancel`` waits at most a second for the job's row; when another session holds it
longer (a stalled transaction, a ``SELECT ... FOR UPDATE`` left open), the request is recorded here
(job id, when, by whom) and answered at once; the worker reads it as a cancel. No foreign key to
``jobs``: inserting one would wait for the same row lock.

Revision ID: 0014
Revises: 0013
Create Date: 2027-01-21 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``cancel_requests``."""
    op.create_table(
        "cancel_requests",
        sa.Column("job_id", sa.String(length=36), primary_key=True),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("requested_by", sa.String(length=255), nullable=False),
    )


def downgrade() -> None:
    """Drop ``cancel_requests``."""
    op.drop_table("cancel_requests")
