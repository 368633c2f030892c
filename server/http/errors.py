"""JSON error responses: ``{"detail": "..."}`` for 404/409/413/503 (FastAPI's own 422 format is kept).

An unreachable database and a pool with no connection free within
``HALFCAST_DB_POOL_TIMEOUT_S`` are both ``503`` with ``Retry-After``: a request never
waits longer than that for a connection. Both pools answer alike: SQLAlchemy's
(``OperationalError``/``InterfaceError``, ``sqlalchemy.exc.TimeoutError``) and the async
one of ``GET /jobs/{id}`` on PostgreSQL (psycopg's ``OperationalError``/``InterfaceError``,
:class:`halfcast.core.db.async_pool.PoolBusy`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TypedDict

import psycopg
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from halfcast.common.redact import redact_urls
from halfcast.core.db.async_pool import PoolBusy
from server.schemas import ErrorBody

log = logging.getLogger(__name__)


class ErrorItem(TypedDict):
    """One item of a 422's ``detail``, as FastAPI writes pydantic's: ``loc`` starts with the source (``body``...)."""

    type: str
    loc: Sequence[str | int]
    msg: str
    input: object


class ApiError(Exception):
    """An error answered as ``ErrorBody`` JSON with ``status_code``."""

    def __init__(
        self, status_code: int, detail: str, *, job_id: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.body = ErrorBody(detail=redact_urls(detail), job_id=job_id)
        self.headers = headers


def error_response(status_code: int, body: ErrorBody, headers: dict[str, str] | None = None) -> JSONResponse:
    """``body`` as a JSON response (``job_id`` omitted when null)."""
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status_code, headers=headers)


async def _api_error(_request: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, ApiError):  # registered for ApiError only
        raise exc
    return error_response(exc.status_code, exc.body, exc.headers)


async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.error("database error on %s %s: %s", request.method, request.url.path, exc)
    return error_response(503, ErrorBody(detail="database unavailable"), {"Retry-After": "5"})


#: ``Retry-After`` (seconds) of a 503 for a busy database or server: the overload is usually gone by then.
BUSY_RETRY_AFTER_S = 1


async def _database_busy(request: Request, exc: Exception) -> JSONResponse:
    log.warning("no database connection free for %s %s: %s", request.method, request.url.path, exc)
    detail = (
        "database busy: no connection of this API process came free in time "
        "(HALFCAST_DB_POOL_SIZE, HALFCAST_DB_MAX_OVERFLOW, HALFCAST_DB_POOL_TIMEOUT_S); retry later"
    )
    return error_response(503, ErrorBody(detail=detail), {"Retry-After": str(BUSY_RETRY_AFTER_S)})


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers: :class:`ApiError`, an unreachable database and a busy connection pool as 503."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(PoolTimeoutError, _database_busy)
    app.add_exception_handler(PoolBusy, _database_busy)
    app.add_exception_handler(OperationalError, _database_unavailable)
    app.add_exception_handler(InterfaceError, _database_unavailable)
    app.add_exception_handler(psycopg.OperationalError, _database_unavailable)
    app.add_exception_handler(psycopg.InterfaceError, _database_unavailable)
