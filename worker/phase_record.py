"""The ``phase`` records of a run's start-up (:mod:`trainer.startup`), as the job row keeps them.

Rank 0 writes ``{"type": "phase", "time", "phase", "startup"}`` as each start-up phase
begins (``data``, ``model``, ``first_step``) and once the first step is done
(``training``); ``startup`` holds the seconds of the phases ended so far. The worker keeps
the newest one of the attempt in ``jobs.startup`` (migration 0009) as ``{"phase",
"launch_s", "imports_s", "data_s", "model_s", "first_step_s"}``; the job resource derives
its ``phase`` and ``startup`` from it (:mod:`server.schemas`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger(__name__)

Seconds = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


class StartupTimes(BaseModel):
    """Seconds each start-up phase took; ``None`` until it ended (or when the trainer could not time it)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    launch_s: Seconds | None = None
    imports_s: Seconds | None = None
    data_s: Seconds | None = None
    model_s: Seconds | None = None
    first_step_s: Seconds | None = None


class PhaseRecord(BaseModel):
    """A ``phase`` record: the phase that begins and the times of those ended."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    phase: Literal["data", "model", "first_step", "training"]
    startup: StartupTimes = StartupTimes()

    def summary(self) -> dict[str, Any]:
        """What the job row keeps (``jobs.startup``): the phase, then every time (``None`` included)."""
        return {"phase": self.phase, **self.startup.model_dump()}


def parse_phase_record(body: Mapping[str, Any]) -> PhaseRecord | None:
    """The ``phase`` record ``body``; ``None`` (logged) when it names no known phase or has bad times."""
    try:
        return PhaseRecord.model_validate(dict(body))
    except ValidationError as exc:
        log.warning("skipping a phase record that does not validate: %.200r (%s)", dict(body), exc)
        return None
