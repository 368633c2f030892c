"""Timestamp helpers shared by the API modules."""

from __future__ import annotations

from datetime import UTC, datetime


def as_utc(value: datetime) -> datetime:
    """``value`` as an aware UTC datetime; a naive value (SQLite returns those) is read as UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def as_utc_or_none(value: datetime | None) -> datetime | None:
    """:func:`as_utc`, passing ``None`` through."""
    return None if value is None else as_utc(value)
