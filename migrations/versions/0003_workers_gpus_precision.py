"""Worker registry, GPUs per attempt, precision switches.

Creates ``workers``: one row per worker process that registered (its host, pid, GPUs,
concurrency, start and last heartbeat). Adds ``attempts.gpus`` (the GPU indices the
attempt was given, a JSON list; null for CPU jobs) and ``jobs.precision_switches``
(a JSON list of the precision switches a run made, e.g. fp16 → bf16 after divergence
with ``on_divergence: "fallback_bf16"``; null when none).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``workers``; add ``attempts.gpus`` and ``jobs.precision_switches``."""
    op.create_table(
        "workers",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_workers_heartbeat_at", "workers", ["heartbeat_at"])
    op.add_column("attempts", sa.Column("gpus", sa.JSON(), nullable=True))
    op.add_column("jobs", sa.Column("precision_switches", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop what :func:`upgrade` added."""
    op.drop_column("jobs", "precision_switches")  # SQLite >= 3.35 drops a column in place
    op.drop_column("attempts", "gpus")
    op.drop_index("ix_workers_heartbeat_at", table_name="workers")
    op.drop_table("workers")
