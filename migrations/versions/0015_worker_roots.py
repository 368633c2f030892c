"""Workers report their model and data roots: ``workers.model_roots``, ``workers.data_roots``.

The API refuses at submission a model or data path that no registered worker's roots can hold
(``server/input_roots.py``). Null for a worker that does not report them (older workers): the API
then does not judge.

Revision ID: 0015
Revises: 0014
Create Date: 2027-02-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``workers.model_roots`` and ``workers.data_roots``."""
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("model_roots", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("data_roots", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop them."""
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("data_roots")
        batch.drop_column("model_roots")
