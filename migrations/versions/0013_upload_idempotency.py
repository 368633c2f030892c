"""Idempotent uploads: ``Idempotency-Key`` on ``POST /datasets`` and ``POST /models``.

Adds ``idempotency_key`` (the header, unique per owner) and ``request_hash`` (SHA-256 of what the
request sent: its parameters and the body's SHA-256) to ``datasets`` and ``models``, and a unique
index on ``(owner, idempotency_key)`` of each (NULL keys do not collide).

Revision ID: 0013
Revises: 0012
Create Date: 2027-01-20 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("datasets", "models")


def upgrade() -> None:
    """Add the two columns and the unique index to ``datasets`` and ``models``."""
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("idempotency_key", sa.String(length=255), nullable=True))
            batch.add_column(sa.Column("request_hash", sa.String(length=64), nullable=True))
        op.create_index(f"ix_{table}_owner_idempotency_key", table, ["owner", "idempotency_key"], unique=True)


def downgrade() -> None:
    """Drop the index and the two columns."""
    for table in TABLES:
        op.drop_index(f"ix_{table}_owner_idempotency_key", table_name=table)
        with op.batch_alter_table(table) as batch:
            batch.drop_column("request_hash")
            batch.drop_column("idempotency_key")
