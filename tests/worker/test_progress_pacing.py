"""worker/records/pacing.py: step records alone reach the job row at most once per interval; nothing else waits.

Unit tests of the decisions on a fake clock; tests/worker/test_runner.py's runs check the row at the end.
"""

from __future__ import annotations

from halfcast.contracts.records import EvalRecord, PrecisionSwitchRecord, StepRecord
from worker.records.pacing import JobRowPacing, Plan
from worker.store import Progress


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _steps(*steps: int) -> Progress:
    return Progress(steps=[StepRecord(step=step, time=float(step)) for step in steps])


def _stored(pacing: JobRowPacing, progress: Progress, *, now: bool = False) -> Plan:
    plan = pacing.plan(progress, now=now)
    pacing.written(plan)
    return plan


def _row_steps(plan: Plan) -> list[int]:
    return [record.step for record in plan.progress.steps]


def test_steps_alone_set_the_row_once_per_interval_carrying_the_newest() -> None:
    clock = _Clock()
    pacing = JobRowPacing(1.0, clock)
    assert _stored(pacing, _steps(1, 2)).job_row  # the first write
    clock.now += 0.3
    assert not _stored(pacing, _steps(3, 4)).job_row
    clock.now += 0.3
    assert not _stored(pacing, _steps(5)).job_row
    clock.now += 0.5  # 1.1 s since the last write
    plan = _stored(pacing, _steps(6))
    assert plan.job_row and _row_steps(plan) == [5, 6]  # the deferred newest rides along (stored again: ignored)
    clock.now += 0.1
    assert not _stored(pacing, _steps(7)).job_row


def test_anything_but_steps_sets_the_row_at_once() -> None:
    clock = _Clock()
    pacing = JobRowPacing(1.0, clock)
    _stored(pacing, _steps(1))
    eval_poll = Progress(steps=[StepRecord(step=2, time=2.0)], evals=[EvalRecord(step=2, loss=0.5)])
    assert _stored(pacing, eval_poll).job_row
    for other in (Progress(world_size=2), Progress(startup={"phase": "loading data"}), Progress(data={"rows": 3})):
        assert _stored(pacing, other).job_row


def test_a_poll_that_read_nothing_writes_what_was_deferred_once_due_or_at_the_end() -> None:
    clock = _Clock()
    pacing = JobRowPacing(1.0, clock)
    _stored(pacing, _steps(1))
    assert pacing.pending() is None  # nothing deferred
    assert not _stored(pacing, _steps(2, 3)).job_row
    assert pacing.pending() is None  # not due yet
    last = pacing.pending(now=True)  # the run ended: at once
    assert last is not None and last.job_row and _row_steps(last) == [3]
    clock.now += 1.0
    due = pacing.pending()
    assert due is not None and _row_steps(due) == [3]
    pacing.written(due)
    assert pacing.pending(now=True) is None


def test_the_last_records_set_the_row_at_once() -> None:
    pacing = JobRowPacing(1.0, _Clock())
    _stored(pacing, _steps(1))
    assert _stored(pacing, _steps(2), now=True).job_row


def test_a_precision_switch_drops_the_deferred_step_it_rewinds() -> None:
    clock = _Clock()
    pacing = JobRowPacing(1.0, clock)
    _stored(pacing, _steps(1))
    assert not _stored(pacing, _steps(2, 3, 4)).job_row
    switch = PrecisionSwitchRecord(step=4, to="bf16", reason="divergence", rewound_to_step=1, time=5.0)
    plan = _stored(pacing, Progress(steps=[StepRecord(step=2, time=6.0)], switches=[switch]))
    assert plan.job_row and _row_steps(plan) == [2]  # step 4 was trained again from 1: never carried back


def test_an_interval_of_zero_sets_the_row_every_poll() -> None:
    pacing = JobRowPacing(0.0, _Clock())
    assert all(_stored(pacing, _steps(step)).job_row for step in range(1, 5))
