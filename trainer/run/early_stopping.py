"""The best evaluation so far, for ``keep_best`` and ``early_stopping`` (torch-free).

:class:`BestTracker` ranks the eval records of a run by one metric (``spec.best_metric``:
early stopping's, else ``loss``; lower is better for loss and perplexity, higher for
accuracy). An evaluation *improves* when its value beats the best so far by more than
``min_delta`` (the first finite value always does); a missing or non-finite value
(``perplexity`` of a huge loss) never does. After ``patience`` evaluations in a row
without improvement, :meth:`BestTracker.update` says stop. Its state (best step and
value, evaluations without improvement) goes into every checkpoint, so a resumed run
ranks and stops exactly as an uninterrupted one.

Every rank holds a tracker and feeds it rank 0's metric value (broadcast by the loop), so
every rank takes the same decisions at the same evaluation step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypedDict

from halfcast.contracts.records import StoppedEarly
from halfcast.contracts.spec import JobSpec

#: Checkpoint entry holding the tracker's state.
TRACKER_KEY: Final = "best_evaluation"


class TrackerState(TypedDict):
    """The tracker's checkpoint entry (:data:`TRACKER_KEY`): the best evaluation and the evaluations since."""

    best_step: int | None
    best_value: float | None
    stale: int


@dataclass(frozen=True)
class Decision:
    """What one evaluation means: it is the new best (``improved``), and the run should stop (``stop``)."""

    improved: bool
    stop: bool


class BestTracker:
    """The best evaluation of a run by ``metric`` and the evaluations since it (see the module docstring)."""

    def __init__(self, metric: str, mode: str, patience: int | None, min_delta: float) -> None:
        self.metric, self.mode, self.patience, self.min_delta = metric, mode, patience, min_delta
        self.best_step: int | None = None
        self.best_value: float | None = None
        self.stale = 0  # evaluations in a row without improvement

    @classmethod
    def for_spec(cls, spec: JobSpec) -> BestTracker:
        """The tracker of ``spec``: early stopping's metric, patience and ``min_delta``, else ``loss`` without stopping."""
        rule = spec.early_stopping
        if rule is None:
            return cls("loss", "min", None, 0.0)
        return cls(rule.metric, rule.mode, rule.patience, rule.min_delta)

    def update(self, step: int, value: float | None) -> Decision:
        """Rank the evaluation at ``step`` whose metric is ``value``; return what it means."""
        if self._improves(value):
            self.best_step, self.best_value, self.stale = step, value, 0
            return Decision(improved=True, stop=False)
        self.stale += 1
        return Decision(improved=False, stop=self.patience is not None and self.stale >= self.patience)

    def _improves(self, value: float | None) -> bool:
        if value is None or not math.isfinite(value):
            return False
        if self.best_value is None:
            return True
        gain = self.best_value - value if self.mode == "min" else value - self.best_value
        return gain > self.min_delta

    def state_dict(self) -> TrackerState:
        """The state a checkpoint keeps."""
        return {"best_step": self.best_step, "best_value": self.best_value, "stale": self.stale}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restore :meth:`state_dict` (``None``: a checkpoint without one, i.e. nothing evaluated yet)."""
        state = state or {}
        self.best_step = state.get("best_step")
        self.best_value = state.get("best_value")
        self.stale = int(state.get("stale", 0))

    def stopped_early(self, step: int) -> StoppedEarly:
        """The end record's ``stopped_early``: ``step``, ``metric``, ``best_step`` and ``best_value`` (all four set)."""
        return StoppedEarly(step=step, metric=self.metric, best_step=self.best_step, best_value=self.best_value)
