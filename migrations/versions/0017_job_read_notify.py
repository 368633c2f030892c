"""PostgreSQL tells listeners when what ``GET /jobs/{id}`` reads changes: ``NOTIFY halfcast_job_reads``.

A trigger on each table the job resource is read from (``jobs``, ``attempts``, ``job_members``,
``api_tokens``) sends, for every row inserted, updated or deleted, ``job:<job id>`` or
``token:<token id>`` on the channel (``pg_notify``; delivered at commit, once per distinct payload
in a transaction). An API with ``HALFCAST_POLL_READS=notified`` keeps its polls' reads until told
(:mod:`halfcast.core.db.change_feed`, :mod:`server.http.recent_reads`). Nothing on SQLite, which
has no notifications.

Revision ID: 0017
Revises: 0016
Create Date: 2027-02-09 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The tables the job resource is read from, and the kind and column their rows are told by.
TOLD_TABLES = {
    "jobs": "'job:' || r.id",
    "attempts": "'job:' || r.job_id",
    "job_members": "'job:' || r.job_id",
    "api_tokens": "'token:' || r.id",
}
FUNCTION = "halfcast_notify_job_read"
TRIGGER = "halfcast_job_read_changed"


def _function_sql() -> str:
    branches = "\n    ELS".join(
        f"IF TG_TABLE_NAME = '{table}' THEN\n        PERFORM pg_notify('halfcast_job_reads', {payload});"
        for table, payload in TOLD_TABLES.items()
    )
    return f"""
CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    {branches}
    END IF;
    RETURN NULL;
END
$$;
"""


def upgrade() -> None:
    """Create the function and one ``AFTER`` row trigger per table (PostgreSQL only)."""
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_function_sql())
    for table in TOLD_TABLES:
        op.execute(
            f"CREATE TRIGGER {TRIGGER} AFTER INSERT OR UPDATE OR DELETE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()"
        )


def downgrade() -> None:
    """Drop the triggers and the function."""
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TOLD_TABLES:
        op.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {table}")
    op.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
