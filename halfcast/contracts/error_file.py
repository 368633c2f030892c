"""``error.json``: the typed failure a rank writes before a non-zero exit (docs/architecture.md, "The run directory").

``{"reason", "message", "rank"}``: ``reason`` is one of :class:`halfcast.contracts.status.FailureReason`
(kept a string here, so a reason the reader does not know still reads), ``message`` a human
explanation, ``rank`` the global rank that failed. The trainer writes it (``trainer.__main__``),
the worker reads it (:mod:`worker.lifecycle.outcomes`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ErrorFile(BaseModel):
    """The content of ``error.json``; unknown fields are allowed and ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    reason: str = Field(min_length=1)
    message: str | None = None
    rank: int | None = None
