"""Registered datasets and models, and the per-owner storage quota.

Creates ``datasets`` (uploaded dataset files: owner, name, format, file format, rows,
bytes, SHA-256; the file is content-addressed under ``<data_dir>/registry/datasets``)
and ``models`` (registered Hugging Face model directories under
``<data_dir>/registry/models/<id>``: owner, name, model type, files, bytes, a digest,
and the job an exported model came from). Adds ``owner_quotas.max_storage_bytes``
(null: the server's default, ``HALFCAST_QUOTA_MAX_STORAGE_BYTES``).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-20 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``datasets`` and ``models``; add ``owner_quotas.max_storage_bytes``."""
    op.create_table(
        "datasets",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("file_format", sa.String(length=8), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_datasets_owner_created", "datasets", ["owner", "created_at"])
    op.create_index("ix_datasets_sha256", "datasets", ["sha256"])
    op.create_table(
        "models",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("model_type", sa.String(length=64), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("source_job_id", sa.String(length=36), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_models_owner_created", "models", ["owner", "created_at"])
    op.add_column("owner_quotas", sa.Column("max_storage_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    """Drop what :func:`upgrade` added (the rows only: files under the registry directory stay)."""
    op.drop_column("owner_quotas", "max_storage_bytes")
    op.drop_index("ix_models_owner_created", table_name="models")
    op.drop_table("models")
    op.drop_index("ix_datasets_sha256", table_name="datasets")
    op.drop_index("ix_datasets_owner_created", table_name="datasets")
    op.drop_table("datasets")
