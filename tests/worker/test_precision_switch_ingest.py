"""A ``precision_switch`` record (``on_divergence: "fallback_bf16"``) rewinds the stored step records.

The records of one drain arrive in file order: old fp16 steps, the switch, then the
bf16 re-run of the steps after ``rewound_to_step``. The stored records must end up as
the bf16 continuation, without duplicates and without keeping the abandoned fp16 rows.
Runs on SQLite and on the real PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session
from worker_support import insert_job, present

from halfcast.core.db.models import Job, StepRow
from worker.runner import Attempt
from worker.store import Claim, JobStore, Progress

SWITCH = {
    "type": "precision_switch",
    "time": 50.0,
    "step": 12,
    "from": "fp16",
    "to": "bf16",
    "reason": "loss_scale_collapsed",
    "message": "collapsed (at step 12)",
    "rewound_to_step": 8,
}


def _step(step: int, precision: str = "fp16") -> dict[str, Any]:
    record = {
        "type": "step",
        "step": step,
        "time": float(step),
        "loss": 1.0 / step if precision == "fp16" else 2.0 / step,
    }
    return record | ({"precision": precision} if precision != "fp16" else {})


def _progress(records: list[dict[str, Any]]) -> Progress:
    """What the runner makes of one drain of records (only ``end`` of the attempt is touched)."""
    return Attempt._progress(cast(Attempt, SimpleNamespace(end=None)), records)  # only its end is read


def _claimed(db: Engine, tmp_path: Path) -> tuple[JobStore, Claim]:
    store = JobStore(db)
    claim = store.claim(insert_job(db), "w", tmp_path)
    assert claim is not None
    return store, claim


def _stored(db: Engine, job_id: str) -> tuple[list[tuple[int, object, object]], Job]:
    with db.connect() as conn:
        rows = conn.execute(select(StepRow.step, StepRow.data).where(StepRow.job_id == job_id).order_by(StepRow.step))
        steps = [(step, data.get("precision", "fp16"), data["loss"]) for step, data in rows]
    with Session(db) as session:
        job = session.get_one(Job, job_id)
    return steps, job


def test_a_switch_in_the_middle_of_a_drain_leaves_the_bf16_continuation(db: Engine, tmp_path: Path) -> None:
    store, claim = _claimed(db, tmp_path)
    first = [_step(s) for s in range(1, 11)] + [{"type": "eval", "step": 10, "loss": 0.5}]
    assert store.record_progress(claim.fence, _progress(first))
    drain = [_step(11), _step(12), SWITCH, *(_step(s, "bf16") for s in (9, 10, 11))]
    assert store.record_progress(claim.fence, _progress(drain))

    steps, job = _stored(db, claim.job_id)
    assert steps == [(s, "fp16", 1.0 / s) for s in range(1, 9)] + [(s, "bf16", 2.0 / s) for s in (9, 10, 11)]
    assert (job.step, present(job.latest)["step"], present(job.latest)["precision"], job.eval) == (11, 11, "bf16", None)
    assert job.precision_switches == [{k: v for k, v in SWITCH.items() if k != "type"}]


def test_a_drain_that_ends_at_the_switch_rewinds_latest(db: Engine, tmp_path: Path) -> None:
    store, claim = _claimed(db, tmp_path)
    assert store.record_progress(claim.fence, _progress([_step(s) for s in range(1, 13)]))
    assert store.record_progress(claim.fence, _progress([SWITCH]))
    steps, job = _stored(db, claim.job_id)
    assert [s for s, _, _ in steps] == list(range(1, 9))
    assert (job.step, present(job.latest)["step"]) == (8, 8)
    assert store.record_progress(claim.fence, _progress([_step(9, "bf16")]))
    assert _stored(db, claim.job_id)[0][-1] == (9, "bf16", 2.0 / 9)


def test_a_replayed_or_inherited_switch_is_recorded_once(db: Engine, tmp_path: Path) -> None:
    """A retry replays the switch from the fp16 checkpoint; a run resumed after it repeats it in ``start``."""
    store, claim = _claimed(db, tmp_path)
    assert store.record_progress(claim.fence, _progress([_step(s) for s in range(1, 13)] + [SWITCH]))
    assert store.record_progress(claim.fence, _progress([_step(9, "bf16"), _step(10, "bf16")]))
    replay = [SWITCH | {"time": 99.0, "message": "again"}, _step(9, "bf16")]
    start = {"type": "start", "world_size": 1, "precision": "bf16", "precision_switch": SWITCH | {"time": 7.0}}
    assert store.record_progress(claim.fence, _progress([start, *replay]))

    steps, job = _stored(db, claim.job_id)
    assert steps[-1] == (9, "bf16", 2.0 / 9) and len(steps) == 9
    assert len(present(job.precision_switches)) == 1


def test_a_switch_from_another_job_arrives_with_the_start_record(db: Engine, tmp_path: Path) -> None:
    """``resume_from`` a switched checkpoint: the new job runs bf16 from its start and says so."""
    store, claim = _claimed(db, tmp_path)
    start = {
        "type": "start",
        "world_size": 1,
        "precision": "bf16",
        "precision_switch": SWITCH | {"time": 7.0},
        "resumed_from_step": 12,
    }
    assert store.record_progress(claim.fence, _progress([start, _step(13, "bf16")]))
    steps, job = _stored(db, claim.job_id)
    assert steps == [(13, "bf16", 2.0 / 13)]
    assert [s["to"] for s in present(job.precision_switches)] == ["bf16"] and job.world_size == 1
