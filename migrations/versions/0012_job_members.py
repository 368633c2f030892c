"""Gang memberships of multi-node jobs.

Creates ``job_members``: one row per node of a multi-node job's gang per attempt (job id,
attempt, node rank, worker id, host address, node 0's rendezvous port, status, exit code,
joined / launched / ended timestamps, the membership's lease). Two partial unique indexes
keep the gang formation a compare-and-set: a worker holds at most one open (``joined`` or
``running``) membership, and a node rank of an attempt belongs to one membership that was
not ``released``. ``jobs.status`` is a plain string column, so the new status ``gathering``
needs no change to it.

Revision ID: 0012
Revises: 0011
Create Date: 2027-01-10 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN = sa.text("status IN ('joined', 'running')")
RANKED = sa.text("status <> 'released'")


def upgrade() -> None:
    """Create ``job_members`` and its indexes."""
    op.create_table(
        "job_members",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(length=36), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node_rank", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=255), nullable=False),
        sa.Column("host_address", sa.String(length=255), nullable=True),
        sa.Column("rendezvous_port", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("launched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_job_members_job_attempt", "job_members", ["job_id", "attempt"])
    op.create_index(
        "ux_job_members_open_worker",
        "job_members",
        ["worker_id"],
        unique=True,
        sqlite_where=OPEN,
        postgresql_where=OPEN,
    )
    op.create_index(
        "ux_job_members_node_rank",
        "job_members",
        ["job_id", "attempt", "node_rank"],
        unique=True,
        sqlite_where=RANKED,
        postgresql_where=RANKED,
    )


def downgrade() -> None:
    """Drop ``job_members``."""
    op.drop_table("job_members")
