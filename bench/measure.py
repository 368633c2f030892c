"""Timing and host-sync counting of benchmarked paths, interleaved so machine noise hits all alike.

Timing: every runner first takes ``warmup`` steps. Then ``rounds`` rounds; in each, every
runner takes ``steps`` consecutive steps (its flushes included) and the wall time of
the block is divided by ``steps``. The order of the runners rotates every round
(ABC, BCA, CAB, ...), so no path always runs first or last after a garbage collection,
which is done before every block. The reported per-step time is the median over rounds;
the ratio to the reference is the median over rounds of the per-round ratio (paired,
so slow drifts of the shared machine cancel).

Syncs: :class:`trainer.sync_counter.HostSyncCounter` around each of ``steps`` steady-state
steps (after timing, so well past warm-up), separately around each flush.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bench.peers.base import Runner
from trainer.data import Batch
from trainer.sync_counter import HostSyncCounter


@dataclass
class BatchCycle:
    """Endless round-robin over preloaded micro-batches; each runner gets its own cursor."""

    batches: Sequence[Batch]
    position: int = 0

    def next(self) -> Batch:
        """The next micro-batch, wrapping around."""
        batch = self.batches[self.position % len(self.batches)]
        self.position += 1
        return batch


@dataclass
class SyncCounts:
    """Host syncs of one path: per steady-state step (flush excluded) and per flush."""

    per_step: list[int] = field(default_factory=list)
    per_flush: list[int] = field(default_factory=list)

    @property
    def steady(self) -> int:
        """The largest per-step count (0 only if *every* counted step was sync-free)."""
        return max(self.per_step, default=0)


def run_steps(runner: Runner, cycle: BatchCycle, steps: int) -> None:
    """``steps`` steps of ``runner``, each followed by its flush when one is due."""
    for _ in range(steps):
        runner.step(cycle.next())
        runner.maybe_flush()


def time_block(runner: Runner, cycle: BatchCycle, steps: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per step of ``steps`` consecutive steps (flushes included), after a garbage collection.

    ``clock``: wall time by default; ``time.thread_time`` counts only this thread's CPU time (what a
    single-threaded step costs the host, whatever else the machine runs).
    """
    gc.collect()
    start = clock()
    run_steps(runner, cycle, steps)
    return (clock() - start) / steps


def interleaved_times(
    runners: Mapping[str, Runner],
    cycles: Mapping[str, BatchCycle],
    steps: int,
    rounds: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Seconds per step of each runner in each round (by ``clock``), the run order rotated by one every round."""
    names = list(runners)
    times: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(time_block(runners[name], cycles[name], steps, clock))
    return times


def count_syncs(runner: Runner, cycle: BatchCycle, steps: int) -> SyncCounts:
    """Host syncs in each of ``steps`` steps, and in each flush among them, counted separately."""
    counts = SyncCounts()
    for _ in range(steps):
        counts.per_step.append(counted_step(runner, cycle.next()))
        with HostSyncCounter() as in_flush:
            flushed = runner.maybe_flush()
        if flushed:
            counts.per_flush.append(in_flush.total)
    return counts


def counted_step(runner: Runner, batch: Batch) -> int:
    """Host syncs of one step: the runner's own ``counted_step`` when it has one (a path that steps
    in another thread counts there), else a :class:`HostSyncCounter` around ``runner.step``."""
    own = getattr(runner, "counted_step", None)
    if callable(own):
        return int(own(batch))
    with HostSyncCounter() as in_step:
        runner.step(batch)
    return in_step.total


def paired_ratios(times: Sequence[float], reference: Sequence[float]) -> list[float]:
    """Per-round ``times[i] / reference[i]``."""
    return [t / r for t, r in zip(times, reference, strict=True)]


def median(values: Sequence[float]) -> float:
    """The median (``statistics.median``); ``nan`` for no values."""
    return statistics.median(values) if values else float("nan")
