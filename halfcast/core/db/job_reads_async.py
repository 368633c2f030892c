"""``GET /jobs/{id}``'s read on PostgreSQL, in the event loop: psycopg's async connections, no SQLAlchemy per request.

The same statements as :func:`halfcast.core.db.job_reads.read_job` (compiled once at start-up
from the same SQLAlchemy ``select``: :mod:`halfcast.core.db.pg_compiled`), the same rows mapped
to the same views, the token's ``last_used_at`` refreshed by the same rule and
``UPDATE``; only the execution differs: on a connection of an :class:`AsyncPool`,
without a hop to a worker thread. A dead connection is replaced and the read made
once more (:meth:`AsyncPool.run`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from sqlalchemy import Dialect

from halfcast.core.db.async_pool import AsyncPool
from halfcast.core.db.job_reads import (
    JobRead,
    job_view,
    members_params,
    members_statement,
    needs_touch,
    read_params,
    read_statement,
    token_view,
    touched,
    with_members,
)
from halfcast.core.db.models import utcnow
from halfcast.core.db.pg_compiled import CompiledStatement, compile_for
from halfcast.core.db.tokens import touch_statement


class AsyncJobReads:
    """:func:`halfcast.core.db.job_reads.read_job` on ``pool``'s connections; statements compiled for ``dialect``."""

    def __init__(self, pool: AsyncPool, dialect: Dialect) -> None:
        self.pool = pool
        self._dialect = dialect
        self._reads = {with_token: compile_for(read_statement(with_token), dialect) for with_token in (False, True)}
        self._members = compile_for(members_statement(), dialect)

    async def read(self, job_id: str, token_hash: str | None) -> JobRead:
        """The job ``job_id`` and, when ``token_hash`` is given, the token with that hash (as ``read_job``)."""
        params = read_params(job_id, token_hash)

        async def work(conn: psycopg.AsyncConnection) -> JobRead:
            return await self._read(conn, params, token_hash is not None)

        return await self.pool.run(work)

    async def _read(self, conn: psycopg.AsyncConnection, params: dict[str, str], with_token: bool) -> JobRead:
        rows = await _fetch(conn, self._reads[with_token], params)
        job = job_view(rows, with_token)
        extra = members_params(job)
        if job is not None and extra is not None:
            job = with_members(job, await _fetch(conn, self._members, extra))
        if not with_token:
            return JobRead(None, job)
        token = token_view(rows)
        if token is None:
            return JobRead(None, None)
        now = utcnow()
        if needs_touch(token, now):  # at most once a minute per token: compiled when needed
            touch = compile_for(touch_statement(token.id, now), self._dialect)
            await conn.execute(touch.sql, touch.params())
            token = touched(token, now)
        return JobRead(token, job)

    async def close(self) -> None:
        """Close the pool's idle connections."""
        await self.pool.close()


async def _fetch(
    conn: psycopg.AsyncConnection, statement: CompiledStatement, values: Mapping[str, Any]
) -> list[Sequence[Any]]:
    cursor = await conn.execute(statement.sql, statement.params(values))
    return [statement.row(row) for row in await cursor.fetchall()]
