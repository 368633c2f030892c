"""``max_runtime_s``: the running time a job may use over all its attempts."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping


class Deadline:
    """The end of this attempt's share of ``max_runtime_s`` (``None``: no limit).

    ``used_s`` is the running time of the job's earlier attempts; this attempt's time
    counts from the construction of the object (right after the claim).
    """

    def __init__(
        self, max_runtime_s: float | None, used_s: float = 0.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_runtime_s = max_runtime_s
        self.used_s = used_s
        self.clock = clock
        self.started = clock()

    @classmethod
    def for_spec(cls, spec: Mapping[str, object], used_s: float) -> Deadline:
        """The deadline for a stored spec (its ``max_runtime_s``, if a positive number)."""
        value = spec.get("max_runtime_s")
        limit = float(value) if isinstance(value, (int, float)) and value > 0 else None
        return cls(limit, used_s)

    def elapsed_s(self) -> float:
        """Running time used so far, earlier attempts included."""
        return self.used_s + self.clock() - self.started

    def passed(self) -> bool:
        """Whether the job has used up ``max_runtime_s``."""
        return self.max_runtime_s is not None and self.elapsed_s() >= self.max_runtime_s

    def message(self) -> str:
        """Why the job was stopped."""
        return f"the job ran {self.elapsed_s():.1f} s, past its max_runtime_s of {self.max_runtime_s:g} s"
