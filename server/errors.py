"""JSON error responses: ``{"detail": "..."}`` for 404/409/413/503 (FastAPI's own 422 format is kept)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError

from server.redact import redact_urls
from server.schemas import ErrorBody

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error answered as ``ErrorBody`` JSON with ``status_code``."""

    def __init__(self, status_code: int, detail: str, *, job_id: str | None = None, headers: dict[str, str] | None = None) -> None:
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


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers: :class:`ApiError`, and an unreachable database as 503."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(OperationalError, _database_unavailable)
    app.add_exception_handler(InterfaceError, _database_unavailable)
