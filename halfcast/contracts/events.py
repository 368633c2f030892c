"""The payloads of the API's Server-Sent Events, by event name (docs/api.md, "Events" and "Logs").

``GET /jobs/{id}/events`` sends :data:`JOB_EVENTS` (:mod:`server.events`), ``GET /jobs/{id}/logs?follow=true``
:data:`LOG_EVENTS` (:mod:`server.logstream`); each event's ``data`` is one JSON object, the model its name
maps to. :class:`halfcast.client.HalfcastClient` reads them back as these models.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, Field

from halfcast.contracts.resources import JobPublic
from halfcast.contracts.status import JobStatus
from halfcast.contracts.stored import StoredEval, StoredStep, StoredSwitch


class Rewind(BaseModel):
    """``rewind``: the job went back to the checkpoint at ``step``; the records after it come again as they are redone."""

    step: int = Field(description="The step training goes on from; the event's id too")


class LogAttempt(BaseModel):
    """``attempt``: the log of ``rank`` in ``attempt`` follows (a retry's attempt begins a new one)."""

    attempt: int
    rank: int


class LogChunk(BaseModel):
    """``lines``: new lines of the log of ``rank`` in ``attempt``, oldest first, without line endings."""

    attempt: int
    rank: int
    lines: list[str]


class LogEnd(BaseModel):
    """``end``: the job ended with ``status``; the last attempt followed (``null``: none began). The stream closes."""

    status: JobStatus
    attempt: int | None


#: What the ``data`` of a job event is.
JobEventData = JobPublic | StoredStep | StoredEval | Rewind | StoredSwitch
#: What the ``data`` of a log event is.
LogEventData = LogAttempt | LogChunk | LogEnd

#: The events of ``GET /jobs/{id}/events``: the model of each one's ``data``.
JOB_EVENTS: Mapping[str, type[JobEventData]] = {
    "status": JobPublic, "step": StoredStep, "eval": StoredEval, "rewind": Rewind, "precision_switch": StoredSwitch,
}  # fmt: skip  # one line: the event names and their models side by side
#: The events of ``GET /jobs/{id}/logs?follow=true``: the model of each one's ``data``.
LOG_EVENTS: Mapping[str, type[LogEventData]] = {"attempt": LogAttempt, "lines": LogChunk, "end": LogEnd}
