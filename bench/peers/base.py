"""What a benchmarked path offers the measurement: one optimizer step, an optional flush, a description."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from trainer.data import Batch


@dataclass
class PeerInfo:
    """How a path really ran, for the report.

    ``requested``: the precision the benchmark asked for; ``compute_dtype``: the dtype of
    the first Linear's output seen in a real step (what it *ran* in); ``loss_scaling``,
    ``optimizer``, ``lr_on_skip``: short descriptions; ``notes``: warnings the library
    emitted while being set up, and other caveats.
    """

    label: str
    requested: str
    compute_dtype: str = "unknown"
    loss_scaling: str = "none"
    optimizer: str = ""
    lr_on_skip: str = "n/a"
    version: str = ""
    notes: list[str] = field(default_factory=list)


class Runner(Protocol):
    """One path, set up and ready to step on CPU micro-batches."""

    info: PeerInfo

    def step(self, batch: Batch) -> None:
        """One optimizer step (forward, backward, unscale, clip, step or skip, schedule, zero, per-step telemetry)."""
        ...

    def maybe_flush(self) -> bool:
        """Copy telemetry to the host if an interval is complete (as the real loop does); True if it did."""
        ...

    def close(self) -> None:
        """Release files and other resources."""
        ...


class NotInstalledError(RuntimeError):
    """The library a peer needs is not importable (``pip install -e '.[bench]'``)."""
