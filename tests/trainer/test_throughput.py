"""Throughput that is true (issue 25 item 9): trailing windows of at least 1 s of training time, on a mocked clock.

The scenario is the field's: quick steps (1 ms of compute, 64 samples, 16 tokens each) whose
records cost 25 ms to write at each flush, an evaluation at step 40 (2 s, not training time),
and a flush of just two steps right after it (the status of a 300-step digits job showed such a
2-step interval's rate, 55,182 samples/s, against 2,500-4,800 in its records). Measured per
flush interval, those two steps read a rate far from the job's; over windows of at least 1 s
of training time every record reads the job's real rate, and the headline is the whole run's.
"""

from __future__ import annotations

import pytest

from trainer.run.telemetry import StepRow
from trainer.throughput import MIN_WINDOW_S, Rates, ThroughputMeter

SAMPLES, TOKENS, COMPUTE_S, WRITE_S, EVAL_S, STARTUP_S = 64, 16, 0.001, 0.025, 2.0, 3.0
OVERFLOW_STEPS = {5}


class FakeClock:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _row(step: int) -> StepRow:
    overflow = 1.0 if step in OVERFLOW_STEPS else 0.0
    return StepRow(step, 0.0, 1.0, 1024.0, overflow, 0, 0.5, 0.1, SAMPLES, TOKENS)


def _run(meter: ThroughputMeter, clock: FakeClock, max_steps: int = 300) -> tuple[list[Rates | None], float]:
    """The field's scenario; the rate each step record gets, and the training seconds after step 1."""
    clock.advance(STARTUP_S)  # the first step: start-up, first allocations
    rates = [meter.observe([_row(1)])]
    clock.advance(WRITE_S)
    started = clock.now - WRITE_S
    pending: list[StepRow] = []
    for step in range(2, max_steps + 1):
        clock.advance(COMPUTE_S)
        pending.append(_row(step))
        if step % 10 == 0 or step in (42, max_steps):
            rates += [meter.observe(pending)] * len(pending)
            last_flush = clock.now
            pending = []
            clock.advance(WRITE_S)
        if step == 40:
            meter.pause()
            clock.advance(EVAL_S)
            meter.resume()
    return rates, last_flush - started - EVAL_S


def test_no_record_reads_a_spike_and_the_whole_run_rate_is_the_applied_steps() -> None:
    clock = FakeClock()
    meter = ThroughputMeter(clock)
    rates, training_s = _run(meter, clock)
    whole = meter.whole_run()
    assert whole is not None
    applied = 299 - len(OVERFLOW_STEPS)
    assert whole.samples_per_second == pytest.approx(applied * SAMPLES / training_s, rel=1e-12)
    assert whole.tokens_per_second == pytest.approx(applied * TOKENS / training_s, rel=1e-12)
    attempted_rate = 299 * SAMPLES / training_s
    after_start = [rate.samples_per_second for rate in rates[1:] if rate is not None]
    assert len(after_start) == 299
    assert max(after_start) <= 1.15 * attempted_rate and min(after_start) >= 0.85 * attempted_rate, (
        min(after_start),
        max(after_start),
        attempted_rate,
    )
    assert all(
        rate is not None and rate.tokens_per_second == rate.samples_per_second * TOKENS / SAMPLES for rate in rates
    )
    assert rates[0] is not None and rates[0].samples_per_second == pytest.approx(SAMPLES / STARTUP_S)


def test_the_same_run_measured_per_flush_interval_strays() -> None:
    """No minimum window: the two steps after the evaluation carry the previous flush's 25 ms write alone."""
    clock = FakeClock()
    rates, training_s = _run(ThroughputMeter(clock, min_window_s=0.0), clock)
    per_flush = [rate.samples_per_second for rate in rates[1:] if rate is not None]
    attempted_rate = 299 * SAMPLES / training_s
    assert min(per_flush) < 0.5 * attempted_rate


def test_evaluations_and_checkpoints_are_not_training_time() -> None:
    clock = FakeClock()
    meter = ThroughputMeter(clock)
    meter.observe([_row(1)])
    clock.advance(0.5)
    meter.pause()
    clock.advance(60.0)  # a long evaluation
    meter.resume()
    clock.advance(0.5)
    rate = meter.observe([_row(2), _row(3)])
    assert rate == Rates(2 * SAMPLES / 1.0, 2 * TOKENS / 1.0)
    assert meter.training_time() == 1.0


def test_windows_reach_back_at_least_the_minimum() -> None:
    """Flushes every 0.1 s: each rate covers the latest earlier flush at least MIN_WINDOW_S back."""
    clock = FakeClock()
    meter = ThroughputMeter(clock)
    meter.observe([_row(1)])
    for flush in range(1, 40):
        clock.advance(0.1)
        step_samples = SAMPLES * (2 if flush > 20 else 1)  # the rate doubles at flush 21
        row = _row(flush + 1)._replace(samples=step_samples)
        rate = meter.observe([row])
        assert rate is not None
        if flush > 20 + MIN_WINDOW_S / 0.1:  # the window holds only doubled steps
            assert rate.samples_per_second == pytest.approx(2 * SAMPLES / 0.1)
        elif flush <= 20:
            assert rate.samples_per_second == pytest.approx(SAMPLES / 0.1)
        else:  # a blend: between the two, never beyond
            assert SAMPLES / 0.1 < rate.samples_per_second < 2 * SAMPLES / 0.1


def test_data_without_tokens_has_no_token_rate_and_a_one_flush_run_no_whole_run_rate() -> None:
    clock = FakeClock()
    meter = ThroughputMeter(clock)
    clock.advance(1.0)
    first = meter.observe([_row(1)._replace(tokens=None)])
    assert first == Rates(SAMPLES / 1.0, None)
    assert meter.whole_run() is None
    clock.advance(2.0)
    assert meter.observe([_row(2)._replace(tokens=None)]) == Rates(SAMPLES / 2.0, None)
    assert meter.whole_run() == Rates(SAMPLES / 2.0, None)
