"""Keyset paging, newest first, shared by every list of rows with ``created_at`` and a string ``id``.

A page is the rows after a cursor in ``(created_at, id)`` descending order (ties broken by id, so two
rows created in the same microsecond are never skipped or repeated), fetched with one query of
``limit + 1`` rows; the cursor of the next page is an opaque token naming the page's last row.
Jobs (``GET /jobs``) and the registry's datasets and models (``GET /datasets``, ``GET /models``)
page this way; the audit log pages by its integer id (``halfcast/core/db/audit.py``).
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Select, and_, or_
from sqlalchemy.orm import Session

from halfcast.common.timeutil import as_utc


class InvalidCursor(ValueError):
    """A list cursor that this server did not produce."""


class NewestFirstRow(Protocol):
    """A row pageable by :func:`newest_first`: a creation time and a string id."""

    created_at: datetime
    id: str


def encode_cursor(row: NewestFirstRow) -> str:
    """An opaque cursor pointing just after ``row`` in newest-first order."""
    raw = json.dumps([as_utc(row.created_at).isoformat(), row.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """``(created_at, id)`` of a cursor from :func:`encode_cursor`. Raises :class:`InvalidCursor`."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, row_id = json.loads(raw)
        if not isinstance(row_id, str) or "\x00" in row_id:  # PostgreSQL cannot compare text with NUL
            raise ValueError("the cursor's id is not an id")
        return datetime.fromisoformat(created), row_id
    except (binascii.Error, ValueError, TypeError) as exc:
        raise InvalidCursor(f"invalid cursor {cursor!r}") from exc


def newest_first(
    session: Session, query: Select[Any], table: Any, *, limit: int, cursor: str | None
) -> tuple[list[Any], str | None]:
    """The page of ``query`` (rows of ``table``, filtered as the caller wants) after ``cursor``; the next cursor.

    Raises :class:`InvalidCursor` for a cursor this server did not produce.
    """
    query = query.order_by(table.created_at.desc(), table.id.desc()).limit(limit + 1)
    if cursor is not None:
        created, last_id = decode_cursor(cursor)
        query = query.where(or_(table.created_at < created, and_(table.created_at == created, table.id < last_id)))
    rows = list(session.scalars(query))
    if len(rows) <= limit:
        return rows, None
    return rows[:limit], encode_cursor(rows[limit - 1])
