"""The ``start`` record's data report on the job: ``jobs.data_report``.

A file dataset's rows, splits, rows dropped for having no supervised token, held-out size after drops
and the pad token the job chose, shown on ``GET /jobs/{id}`` (``data``), ``halfcast status`` and the job
page. Null until the trainer's ``start`` record, and for datasets that report nothing.

Revision ID: 0016
Revises: 0015
Create Date: 2027-02-02 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``jobs.data_report``."""
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("data_report", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop it."""
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("data_report")
