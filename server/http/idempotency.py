"""The ``Idempotency-Key`` request header: a POST that creates something is safe to retry with it.

``POST /jobs``, ``POST /datasets`` and ``POST /models`` take it. The same key from the same owner
with the same request answers the thing the first request created (``200``) and stores nothing;
with a different request it is a ``422`` at ``["header", "Idempotency-Key"]``. Keys are per owner.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Header
from fastapi.exceptions import RequestValidationError

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        pattern=r"^[\x21-\x7e]+$",
        description="Makes the POST safe to retry: the same key returns what it created (200) instead of a new one",
    ),
]


def key_mismatch(message: str, key: str | None) -> RequestValidationError:
    """The ``422`` at ``["header", "Idempotency-Key"]`` of a key reused for a different request."""
    return RequestValidationError(
        [{"type": "value_error", "loc": ("header", "Idempotency-Key"), "msg": message, "input": key}]
    )
