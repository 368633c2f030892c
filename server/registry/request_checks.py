"""What the registry routes share: the upload's media type, its name, early refusals (size, quota), 422s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool

from halfcast.core.db.quota_check import QuotaExceeded, storage_in_use
from halfcast.core.db.quotas import QuotaLimits, effective_limits
from server.http.errors import ApiError
from server.quotas import QuotaApiError
from server.registry.upload import declared_length

#: Longest name of a registered dataset or model.
MAX_NAME_CHARS = 200
#: What a registered dataset's or model's id in a path may hold: printable ASCII, no space (ids are UUIDs).
#: A NUL reached PostgreSQL, which cannot compare text holding one (a 500); now it is a 422 at the path.
REGISTRY_ID_PATTERN = r"^[\x21-\x7e]+$"


def invalid(loc: tuple[str | int, ...], message: str, value: Any = None) -> RequestValidationError:
    """A ``422`` at ``loc`` (FastAPI's format)."""
    return RequestValidationError([{"type": "value_error", "loc": loc, "msg": message, "input": value}])


def media_type(request: Request) -> str:
    """The request's ``Content-Type`` without parameters, lower case (``""`` without one)."""
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


def unsupported_media_type(given: str, accepted: list[str]) -> ApiError:
    """The ``415`` of an upload whose ``Content-Type`` is not one of ``accepted``."""
    shown = given or "none"
    return ApiError(415, f"Content-Type must be one of {', '.join(accepted)} (got {shown})")


def checked_name(name: str | None, default: str) -> str:
    """The upload's ``name`` (default ``default``): printable, at most :data:`MAX_NAME_CHARS`; else ``422`` at ``query.name``."""
    if name is None:
        return default[:MAX_NAME_CHARS]
    if not name.strip() or not name.isprintable():
        raise invalid(("query", "name"), "the name must be printable and not blank", name)
    return name.strip()


@dataclass(frozen=True)
class StorageRoom:
    """An owner's storage quota as an upload starts: the ``limit`` and the bytes ``in_use``."""

    owner: str
    limit: int
    in_use: int

    @property
    def left(self) -> int:
        """Bytes the owner may still store (never negative)."""
        return max(0, self.limit - self.in_use)

    def exceeded(self) -> QuotaApiError:
        """The ``429`` of an upload that does not fit."""
        return QuotaApiError(QuotaExceeded(self.owner, "max_storage_bytes", self.limit, self.in_use))


def _storage_room(request: Request, owner: str, defaults: QuotaLimits) -> StorageRoom | None:
    with request.app.state.session_factory() as session:
        limit = effective_limits(session, owner, defaults).max_storage_bytes
        if limit is None:
            return None
        return StorageRoom(owner, limit, storage_in_use(session, owner))


async def storage_room(
    request: Request, owner: str, defaults: QuotaLimits, declared_is_stored: bool
) -> StorageRoom | None:
    """The owner's :class:`StorageRoom` (``None`` without a storage quota); ``429`` before a byte is read when the
    owner is at or over the quota, or (``declared_is_stored``: the body is what would be stored) when the declared
    ``Content-Length`` alone would take it over. The check that counts is made again, atomically, at the INSERT."""
    room = await run_in_threadpool(_storage_room, request, owner, defaults)
    if room is None:
        return None
    declared = declared_length(request) if declared_is_stored else None
    if room.left == 0 or (declared is not None and declared > room.left):
        raise room.exceeded()
    return room
