"""The ``end`` record a run writes last, and the updates it says the run applied.

The trainer writes ``{"type": "end", "time", "steps", "skipped_steps", "applied_steps"}``
(plus ``stopped_early`` when early stopping ended the job before ``max_steps``, and
``exported_step`` for jobs with exports) only after its own end check (``trainer/end_check.py``: a run that applied no update
fails ``no_update_applied`` instead). The worker reads the counts again, so that an
older trainer (whose ``end`` record has no ``applied_steps``) or a stray record can never
make a job ``succeeded`` that learned nothing (:func:`worker.outcomes.ended_outcome`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger(__name__)

Count = Annotated[int, Field(ge=0, strict=True)]


class StoppedEarly(BaseModel):
    """An end record's ``stopped_early``: the step early stopping ended the job at, its metric, and the best evaluation."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    step: Count
    metric: str
    best_step: Count | None = None
    best_value: float | None = None


class EndRecord(BaseModel):
    """The counts of an ``end`` record: attempted, skipped and (newer trainers) applied steps."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    steps: Count
    skipped_steps: Count
    applied_steps: Count | None = None
    stopped_early: StoppedEarly | None = None
    exported_step: Count | None = None

    def summary(self) -> dict[str, Any]:
        """What the job row keeps of the record (``jobs.end_info``): the fields it has, as plain JSON."""
        return self.model_dump(mode="json", exclude_none=True)

    @property
    def applied(self) -> int:
        """Steps that applied an update: the smaller of what the record says and attempted minus skipped."""
        derived = self.steps - self.skipped_steps
        return derived if self.applied_steps is None else min(derived, self.applied_steps)


def parse_end_record(body: Mapping[str, Any]) -> EndRecord | None:
    """The counts of an ``end`` record's ``body``; ``None`` (logged) when they are missing or not counts."""
    try:
        return EndRecord.model_validate(dict(body))
    except ValidationError as exc:
        log.warning("an end record without valid step counts is no end record: %.200r (%s)", dict(body), exc)
        return None
