"""Server-Sent Events as the client reads them: :func:`parse_sse` splits a stream's lines into :class:`Event`s,
:func:`typed_events` reads each event's data as the model its name gives."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from halfcast.contracts.events import JobEventData, LogEventData
from halfcast.errors import parse_model

log = logging.getLogger(__name__)

#: What an :class:`Event` carries: a model, or (from :func:`parse_sse`) the decoded JSON.
D = TypeVar("D")
#: A pydantic model an event's data is read as.
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Event(Generic[D]):
    """One Server-Sent Event: its name ``event``, its ``id``, and its ``data``.

    From :meth:`HalfcastClient.events` and :meth:`HalfcastClient.follow_logs`, ``data`` is the model
    :mod:`halfcast.contracts.events` gives the name (a ``status`` event's is a :class:`~halfcast.contracts.resources.JobPublic`,
    a ``step`` event's a :class:`~halfcast.contracts.stored.StoredStep`...); from :func:`parse_sse`, the decoded JSON.
    """

    event: str
    id: str | None
    data: D


#: An event of a job's stream (``status``, ``step``, ``eval``, ``rewind``, ``precision_switch``).
JobEvent = Event[JobEventData]
#: An event of a followed log (``attempt``, ``lines``, ``end``).
LogEvent = Event[LogEventData]


def parse_sse(lines: Iterator[str]) -> Iterator[Event[Any]]:
    """Events from SSE text lines (``data`` decoded as JSON); comments and ``retry`` lines are skipped."""
    fields: dict[str, str] = {}
    for line in lines:
        if not line:
            if "data" in fields:
                yield Event(fields.get("event", "message"), fields.get("id"), json.loads(fields["data"]))
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            fields[name] = f"{fields[name]}\n{value}" if name == "data" and "data" in fields else value


def typed_events(events: Iterator[Event[Any]], models: Mapping[str, type[M]]) -> Iterator[Event[M]]:
    """``events`` with each ``data`` read as the model of its name in ``models``; events of other names are skipped
    (a newer server's), logged. :class:`HalfcastError` for a payload that does not validate."""
    for event in events:
        model = models.get(event.event)
        if model is None:
            log.debug("skipping an event the client does not know: %s", event.event)
            continue
        yield Event(event.event, event.id, parse_model(model, event.data))
