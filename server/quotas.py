"""Submission quotas, the API side: the server's default limits and the ``429`` answer.

The limits and their enforcement live in :mod:`halfcast.core.db.quotas` and
:mod:`halfcast.core.db.quota_check`; this module turns settings into default limits and a
:class:`~halfcast.core.db.quota_check.QuotaExceeded` into
``429 {"detail", "limit", "value"}`` with ``Retry-After``.
"""

from __future__ import annotations

from halfcast.core.db.quota_check import QuotaExceeded
from halfcast.core.db.quotas import QuotaLimits
from halfcast.core.settings import Settings
from server.http.errors import ApiError
from server.schemas import QuotaErrorBody

#: ``Retry-After`` of a 429 (seconds): quota frees up when the owner's jobs start or end, which takes a while.
QUOTA_RETRY_AFTER_S = 30

#: OpenAPI declaration of the 429 of ``POST /jobs``.
QUOTA_RESPONSE: dict[str, object] = {
    "model": QuotaErrorBody,
    "description": "The job would take its owner over a quota limit (named in `limit`); nothing is stored",
    "headers": {"Retry-After": {"description": "Seconds to wait before trying again", "schema": {"type": "integer"}}},
}


def default_limits(settings: Settings) -> QuotaLimits:
    """The server's per-owner limits (``HALFCAST_QUOTA_MAX_ACTIVE_JOBS``, ``_MAX_GPUS``, ``_MAX_QUEUED_JOBS``,
    ``_MAX_STORAGE_BYTES``)."""
    return QuotaLimits(
        max_active_jobs=settings.quota_max_active_jobs,
        max_gpus=settings.quota_max_gpus,
        max_queued_jobs=settings.quota_max_queued_jobs,
        max_storage_bytes=settings.quota_max_storage_bytes,
    )


class QuotaApiError(ApiError):
    """``429`` with :class:`~server.schemas.QuotaErrorBody` and ``Retry-After`` for a refused submission."""

    def __init__(self, exc: QuotaExceeded) -> None:
        detail = f"quota exceeded: {exc.limit} is {exc.value} for owner {exc.owner} ({exc.in_use} in use)"
        super().__init__(429, detail, headers={"Retry-After": str(QUOTA_RETRY_AFTER_S)})
        self.body = QuotaErrorBody(detail=detail, limit=exc.limit, value=exc.value)
