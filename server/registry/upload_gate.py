"""How many uploads one API process takes at once, in all and per owner, and how slowly one may send.

An upload (``POST /datasets``, ``POST /models``) streams its body for as long as the client sends
it. Held in the API's admission line (:mod:`server.http.admission`), 16 clients sending one byte a
second took every place and every other route answered ``503``. Uploads therefore bypass that
line and pass this gate instead, once the caller is authenticated and before a byte is read: at
most :attr:`UploadGate.max_total` in flight per API process (``503`` past it) and
:attr:`UploadGate.max_per_owner` per owner (``429``). Their bodies are paced
(:class:`UploadPace`): a body that stalls longer than ``idle_s`` between chunks, or that averages
below ``min_rate`` bytes per second once ``grace_s`` have passed, is cut off with ``408``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from halfcast.core.settings import Settings
from server.http.errors import BUSY_RETRY_AFTER_S, ApiError


@dataclass(frozen=True)
class UploadPace:
    """The slowest an upload body may arrive: ``min_rate`` bytes/s on average after ``grace_s``, no gap over ``idle_s``."""

    min_rate: float = 16_384.0
    grace_s: float = 30.0
    idle_s: float = 30.0

    def check(self, received: int, elapsed_s: float) -> None:
        """``ApiError`` 408 when ``received`` bytes after ``elapsed_s`` seconds is below the minimum rate."""
        if elapsed_s > self.grace_s and received < self.min_rate * elapsed_s:
            raise ApiError(
                408,
                f"the upload is too slow: {received} bytes in {elapsed_s:.0f} s, below {self.min_rate:.0f} bytes/s "
                "(HALFCAST_UPLOAD_MIN_RATE_BYTES_PER_S)",
                headers={"Connection": "close"},
            )

    def stalled(self) -> ApiError:
        """The 408 of a body that sent nothing for ``idle_s`` seconds."""
        return ApiError(
            408,
            f"the upload sent nothing for {self.idle_s:.0f} s (HALFCAST_UPLOAD_IDLE_TIMEOUT_S)",
            headers={"Connection": "close"},
        )


@dataclass
class UploadGate:
    """Uploads in flight in one API process: at most ``max_total``, at most ``max_per_owner`` of one owner.

    Lives on the API's event loop (not thread-safe; no ``await`` between a check and its count).
    """

    max_total: int = 32
    max_per_owner: int = 2
    in_flight: Counter[str] = field(default_factory=Counter)

    @asynccontextmanager
    async def admit(self, owner: str) -> AsyncIterator[None]:
        """Hold a place for one upload of ``owner``; ``ApiError`` 429 (the owner's) or 503 (the process's) when full."""
        if self.in_flight[owner] >= self.max_per_owner:
            raise ApiError(
                429,
                f"owner {owner!r} already has {self.in_flight[owner]} uploads in flight "
                f"(HALFCAST_MAX_CONCURRENT_UPLOADS_PER_OWNER={self.max_per_owner}); retry when one ends",
                headers={"Retry-After": str(BUSY_RETRY_AFTER_S)},
            )
        if self.in_flight.total() >= self.max_total:
            raise ApiError(
                503,
                f"server busy: {self.max_total} uploads in flight (HALFCAST_MAX_CONCURRENT_UPLOADS); retry later",
                headers={"Retry-After": str(BUSY_RETRY_AFTER_S)},
            )
        self.in_flight[owner] += 1
        try:
            yield
        finally:
            self.in_flight[owner] -= 1
            if self.in_flight[owner] <= 0:
                del self.in_flight[owner]


def upload_pace(settings: Settings) -> UploadPace:
    """The :class:`UploadPace` of ``settings`` (``HALFCAST_UPLOAD_MIN_RATE_BYTES_PER_S``, ``..._GRACE_S``, ``..._IDLE_...``)."""
    return UploadPace(
        settings.upload_min_rate_bytes_per_s, settings.upload_rate_grace_s, settings.upload_idle_timeout_s
    )
