"""The streams' settings and bookkeeping: which streams are open, and how often they polled.

One :class:`StreamStats` per kind of stream and app (``app.state.event_streams``,
``app.state.log_streams``); :class:`server.metrics.streams.StreamCollector` exports it.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from server.streams.shared_reads import SharedReads

#: How many closed streams :class:`StreamStats` remembers (for tests and debugging).
HISTORY = 256


class EventStreamSettings(BaseSettings):
    """Settings of the streams (events and log follow), from ``HALFCAST_EVENTS_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="HALFCAST_EVENTS_", extra="ignore")

    poll_interval_s: float = Field(
        default=0.1, gt=0.0, le=10.0, description="Seconds between two database polls of one stream"
    )
    heartbeat_s: float = Field(
        default=15.0, gt=0.0, le=300.0, description="Seconds without events before a keepalive comment"
    )
    page_size: int = Field(default=500, ge=1, le=10_000, description="Step records read per poll at most")


@dataclass
class StreamRecord:
    """One stream's life: monotonic open/close times (``time.monotonic()``) and database polls made."""

    job_id: str
    opened_at: float
    closed_at: float | None = None
    polls: int = 0
    events: int = 0


@dataclass
class StreamStats:
    """Open streams of one kind and their database polls, per app (``app.state.event_streams``).

    ``active`` is exported as the ``halfcast_<kind>_streams`` gauge; ``polls`` (all
    streams, ever) as ``halfcast_<kind>_stream_polls_total``. The last :data:`HISTORY`
    closed streams are kept in ``closed``. ``shared`` coalesces the database reads of
    streams asking the same question at the same tick (its ``reads`` are exported as
    ``halfcast_<kind>_stream_reads_total``).
    """

    settings: EventStreamSettings = field(default_factory=EventStreamSettings)
    open_streams: set[int] = field(default_factory=set)
    closed: deque[StreamRecord] = field(default_factory=lambda: deque(maxlen=HISTORY))
    opened_total: int = 0
    polls: int = 0
    _records: dict[int, StreamRecord] = field(default_factory=dict)
    shared: SharedReads[Any] = field(init=False)

    def __post_init__(self) -> None:
        self.shared = SharedReads(fresh_s=self.settings.poll_interval_s / 2)

    @property
    def active(self) -> int:
        """Streams open right now."""
        return len(self.open_streams)

    def open(self, job_id: str) -> StreamRecord:
        """Count a new stream of ``job_id``; the caller must :meth:`close` it."""
        record = StreamRecord(job_id=job_id, opened_at=time.monotonic())
        self.opened_total += 1
        self.open_streams.add(id(record))
        self._records[id(record)] = record
        return record

    def poll(self, record: StreamRecord) -> None:
        """Count one database poll of ``record``'s stream."""
        record.polls += 1
        self.polls += 1

    def close(self, record: StreamRecord) -> None:
        """Mark ``record``'s stream closed (idempotent)."""
        if self._records.pop(id(record), None) is None:
            return
        self.open_streams.discard(id(record))
        record.closed_at = time.monotonic()
        self.closed.append(record)
