"""The runner's state machine against a fake trainer: every path ends in the right terminal status."""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine, delete, insert, select, update
from worker_support import MakeJob, fake_command, job_row, present, small_spec

from halfcast.contracts.spec import JobSpec
from halfcast.contracts.status import JobStatus
from halfcast.core.db.models import Attempt, CancelRequest, Job, StepRow, utcnow
from halfcast.core.settings import Settings
from worker.launch.process_tree import RunProcess, session_members
from worker.lifecycle.recovery import Recovery
from worker.runner import Outcome, RunnerContext, run_job
from worker.store import JobStore


def _context(settings: Settings, store: JobStore, command=fake_command, **extra) -> RunnerContext:
    return RunnerContext(settings=settings, store=store, worker_id="test-worker", build_command=command, **extra)


def _row(engine: Engine, job_id: str) -> Job:
    return job_row(engine, job_id)


def _running_attempt(engine: Engine, job_id: str, attempt: int) -> bool:
    row = _row(engine, job_id)
    return row.status == "running" and row.attempt == attempt


def _steps(engine: Engine, job_id: str) -> list[int]:
    with engine.connect() as conn:
        query = select(StepRow.step).where(StepRow.job_id == job_id).order_by(StepRow.step)
        return list(conn.execute(query).scalars())


def test_success_stores_every_step_latest_and_eval(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    job_id = make_job(small_spec(max_steps=12))
    outcome = run_job(job_id, _context(settings, store))
    assert outcome == Outcome(JobStatus.SUCCEEDED)
    row = _row(engine, job_id)
    assert (row.status, row.step, row.error_reason) == ("succeeded", 12, None)
    assert present(row.latest)["step"] == 12 and "type" not in present(row.latest)
    assert row.eval == {"step": 12, "time": present(row.eval)["time"], "loss": 0.1, "accuracy": 0.95}
    assert _steps(engine, job_id) == list(range(1, 13))
    assert row.end_info == {"steps": 12, "skipped_steps": 0}  # what the run's end record said (jobs.end_info)
    assert row.startup == {
        "phase": "training",
        "launch_s": None,
        "imports_s": 0.01,
        "data_s": 0.01,
        "model_s": 0.01,
        "first_step_s": 0.01,
    }  # the newest phase record (jobs.startup)
    run_dir = settings.runs_dir / job_id / "attempt-1"
    assert row.run_dir == str(run_dir)
    assert JobSpec.model_validate_json((run_dir / "spec.json").read_text()).max_steps == 12
    assert (run_dir / "logs" / "launcher.log").exists()


def test_a_second_message_for_the_job_is_dropped(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    job_id = make_job()
    assert run_job(job_id, _context(settings, store)) == Outcome(JobStatus.SUCCEEDED)
    assert run_job(job_id, _context(settings, store)) is None
    assert _row(engine, job_id).attempt == 1
    assert sorted(p.name for p in (settings.runs_dir / job_id).iterdir()) == ["attempt-1"]


def test_error_json_gives_its_reason_message_and_log_tail(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    job_id = make_job(small_spec(name="typed-error"))
    outcome = run_job(job_id, _context(settings, store))
    assert outcome is not None and (outcome.status, outcome.reason) == ("failed", "nonfinite_gradients")
    row = _row(engine, job_id)
    assert (row.status, row.error_reason) == ("failed", "nonfinite_gradients")
    assert "gradients were non-finite on 50 steps (rank 0)" in present(row.error_message)
    assert "giving up: non-finite gradients" in present(row.error_message)  # the log tail


def test_a_crash_is_rank_failed_with_the_traceback(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    job_id = make_job(small_spec(max_steps=10, faults={"raise_at_step": 4}))
    run_job(job_id, _context(settings, store))
    row = _row(engine, job_id)
    assert (row.status, row.error_reason, row.step) == ("failed", "rank_failed", 3)
    assert "exited with exit code 1" in present(row.error_message)
    assert "RuntimeError: injected failure at step 4" in present(row.error_message)
    assert _steps(engine, job_id) == [1, 2, 3]


@pytest.mark.parametrize("name", ["no-end", "partial"])
def test_exit_0_without_an_end_record_is_a_failure(
    name: str, settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    job_id = make_job(small_spec(name=name))
    run_job(job_id, _context(settings, store))
    row = _row(engine, job_id)
    assert (row.status, row.error_reason) == ("failed", "rank_failed")
    assert "exited 0 without an end record" in present(row.error_message)


def test_an_unstartable_command_is_launch_failed(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob, tmp_path: Path
) -> None:
    job_id = make_job()
    run_job(job_id, _context(settings, store, lambda *_: [str(tmp_path / "missing-python")]))
    row = _row(engine, job_id)
    assert (row.status, row.error_reason) == ("failed", "launch_failed")


def test_a_stored_spec_that_no_longer_validates_is_spec_invalid(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    job_id = make_job({**small_spec(), "bogus": 1})
    run_job(job_id, _context(settings, store))
    row = _row(engine, job_id)
    assert (row.status, row.error_reason) == ("failed", "spec_invalid")
    assert "bogus" in present(row.error_message)


def test_records_written_just_before_exit_are_drained(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor reads once more after the exit: nothing the trainer wrote last is lost."""
    monkeypatch.setattr(RunProcess, "poll", lambda self: self.popen.wait())  # the exit is seen only after it happened
    job_id = make_job(small_spec(max_steps=7))
    assert run_job(job_id, _context(settings, store)) == Outcome(JobStatus.SUCCEEDED)
    assert _steps(engine, job_id) == list(range(1, 8)) and _row(engine, job_id).eval is not None


def _run_in_thread(job_id: str, context: RunnerContext) -> tuple[threading.Thread, list[Outcome | None]]:
    result: list[Outcome | None] = []
    thread = threading.Thread(target=lambda: result.append(run_job(job_id, context)))
    thread.start()
    return thread, result


def _wait_status(engine: Engine, job_id: str, status: str, timeout_s: float = 30) -> Job:
    deadline = time.monotonic() + timeout_s
    while (row := _row(engine, job_id)).status != status:
        assert time.monotonic() < deadline, f"job stayed {row.status}"
        time.sleep(0.05)
    return row


def _set_status(engine: Engine, job_id: str, status: str) -> None:
    with engine.begin() as conn:
        conn.execute(update(Job).where(Job.id == job_id).values(status=status))


def test_cancel_stops_the_whole_run(settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob) -> None:
    job_id = make_job(small_spec(name="stubborn", max_steps=1000, faults={"sleep_per_step_s": 0.1}))
    thread, result = _run_in_thread(job_id, _context(settings, store))
    row = _wait_status(engine, job_id, "running")
    _wait_until(lambda: _row(engine, job_id).step >= 2)
    leader = _leader_pid(Path(present(row.run_dir)))
    assert len(session_members(leader)) >= 2  # the trainer and its SIGTERM-ignoring child
    _set_status(engine, job_id, "cancelling")  # what POST /jobs/{id}/cancel does
    thread.join(timeout=30)
    assert result == [Outcome(JobStatus.CANCELLED, None, "cancelled by request")]
    row = _row(engine, job_id)
    assert (row.status, row.error_reason) == ("cancelled", None) and row.finished_at is not None
    assert session_members(leader) == []


def test_cancel_after_the_run_finished_every_step_keeps_it_succeeded(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    """A cancel that meets a run tearing down after its ``end`` record stops it, and the job stays ``succeeded``."""
    job_id = make_job(small_spec(name="slow-teardown", max_steps=3))
    thread, result = _run_in_thread(job_id, _context(settings, store))
    row = _wait_status(engine, job_id, "running")
    leader = _leader_pid(Path(present(row.run_dir)))
    _wait_until(lambda: _row(engine, job_id).eval is not None)  # the eval record comes just before the end
    _set_status(engine, job_id, "cancelling")
    thread.join(timeout=30)
    assert [present(outcome).status for outcome in result] == ["succeeded"]
    row = _row(engine, job_id)
    assert (row.status, row.error_reason, row.step) == ("succeeded", None, 3)
    assert session_members(leader) == []


def test_an_end_record_that_applied_no_update_fails_the_job(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    """Exit 0 and an (older trainer's) end record counting 5 steps, 5 skipped: the worker says no_update_applied."""
    job_id = make_job(small_spec(name="nothing-applied"))
    outcome = run_job(job_id, _context(settings, store))
    assert outcome is not None and (outcome.status, outcome.reason) == ("failed", "no_update_applied")
    row = _row(engine, job_id)
    assert (row.status, row.error_reason, row.step, present(row.latest)["skipped_steps"]) == (
        "failed",
        "no_update_applied",
        5,
        5,
    )


def test_a_cancel_after_an_end_record_that_applied_no_update_still_fails_the_job(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    job_id = make_job(small_spec(name="nothing-applied-slow-teardown", max_steps=3))
    thread, result = _run_in_thread(job_id, _context(settings, store))
    _wait_status(engine, job_id, "running")
    _wait_until(lambda: _row(engine, job_id).eval is not None)  # the eval record comes just before the end
    _set_status(engine, job_id, "cancelling")
    thread.join(timeout=30)
    assert [(o.status, o.reason) for o in result if o is not None] == [("failed", "no_update_applied")]
    assert (_row(engine, job_id).status, _row(engine, job_id).error_reason) == ("failed", "no_update_applied")


def test_worker_shutdown_stops_the_run_and_fails_the_job(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    """Without a broker to send a retry through (no ``enqueue``), the job fails ``worker_shutdown``."""
    job_id = make_job(small_spec(max_steps=1000, faults={"sleep_per_step_s": 0.1}))
    context = _context(settings, store)
    thread, _ = _run_in_thread(job_id, context)
    row = _wait_status(engine, job_id, "running")
    leader = _leader_pid(Path(present(row.run_dir)))
    context.shutdown.set()
    thread.join(timeout=30)
    assert _row(engine, job_id).error_reason == "worker_shutdown"
    assert _attempts(engine, job_id) == [(1, "failed", "worker_shutdown")]  # nobody took the job back
    assert session_members(leader) == []


def test_an_unexpected_error_kills_the_run_and_fails_the_job(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = make_job(small_spec(max_steps=1000, faults={"sleep_per_step_s": 0.1}))
    calls = {"n": 0}
    original = store.record_progress

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ConnectionError("database went away")
        return original(*args, **kwargs)

    monkeypatch.setattr(store, "record_progress", flaky)
    run_job(job_id, _context(settings, store))
    row = _row(engine, job_id)
    assert (row.status, row.error_reason) == ("failed", "worker_error")
    assert "ConnectionError: database went away" in present(row.error_message)
    assert session_members(_leader_pid(Path(present(row.run_dir)))) == []


def test_cancel_before_launch_starts_nothing(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = make_job()
    real_claim = store.claim

    def claim_then_cancel(*args, **kwargs):
        claim = real_claim(*args, **kwargs)
        _set_status(engine, job_id, "cancelling")
        return claim

    monkeypatch.setattr(store, "claim", claim_then_cancel)
    assert present(run_job(job_id, _context(settings, store))).status == "cancelled"
    assert not (settings.runs_dir / job_id / "attempt-1" / "logs" / "launcher.log").exists()  # never launched


def _wait_until(predicate: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _leader_pid(run_dir: Path) -> int:
    """The pid of the run's leader (the fake trainer writes it)."""
    return int((run_dir / "trainer.pid").read_text())


def _attempts(engine: Engine, job_id: str) -> list[tuple[int, str | None, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.attempt)).all()
    return [(r.attempt, r.status, r.reason) for r in rows]


def _resumed_from(engine: Engine, job_id: str) -> list[int | None]:
    """Each attempt's ``resumed_from_step``, in attempt order."""
    with engine.connect() as conn:
        query = select(Attempt.resumed_from_step).where(Attempt.job_id == job_id).order_by(Attempt.attempt)
        return list(conn.execute(query).scalars())


def _start_record(run_dir: Path) -> dict:
    import json

    records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    return next(record for record in records if record["type"] == "start")


def test_a_shutdown_requeues_the_job_and_the_retry_resumes_from_its_checkpoint(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    """A graceful shutdown requeues: attempt 2 resumes from attempt 1's newest checkpoint; the records stay contiguous."""
    job_id = make_job(small_spec(max_steps=30, checkpoint_interval=3, faults={"sleep_per_step_s": 0.05}))
    sent: list[str] = []
    context = _context(settings, store, enqueue=sent.append)
    thread, result = _run_in_thread(job_id, context)
    _wait_until(lambda: _row(engine, job_id).step >= 8)
    context.shutdown.set()  # the worker shuts down (warm): the run is stopped, the job handed back
    thread.join(timeout=30)
    assert result == [Outcome(JobStatus.FAILED, "worker_shutdown", "the worker shut down while the job ran")]
    row = _row(engine, job_id)
    assert (row.status, row.worker_id, row.error_reason) == ("queued", None, None) and sent == [job_id]
    stopped_at = row.step
    assert run_job(job_id, _context(settings, store, enqueue=sent.append)) == Outcome(JobStatus.SUCCEEDED)
    resumed = _start_record(settings.runs_dir / job_id / "attempt-2")["resumed_from_step"]
    assert resumed % 3 == 0 and 6 <= resumed <= stopped_at
    assert _steps(engine, job_id) == list(range(1, 31))
    assert _attempts(engine, job_id) == [(1, "requeued", "worker_shutdown"), (2, "succeeded", None)]  # not a failure
    assert _resumed_from(engine, job_id) == [None, resumed]  # what the trainer's start record says
    assert _row(engine, job_id).attempt == 2


def test_a_finished_attempt_whose_outcome_was_dropped_is_recorded_not_trained_again(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    """Issue 24 item 5: attempt 1 finished all its steps and wrote final.pt and its end record while the database
    stalled, lost its lease, and its ``succeeded`` was dropped; the reaper requeued the job. Attempt 2 records
    attempt 1's success (its steps backfilled) and trains nothing: it re-ran steps 551-600 before."""
    job_id = make_job(small_spec(max_steps=12))
    assert run_job(job_id, _context(settings, store)) == Outcome(JobStatus.SUCCEEDED)
    first = settings.runs_dir / job_id / "attempt-1"
    (first / "checkpoints").mkdir(exist_ok=True)
    (first / "checkpoints" / "final.pt").write_text("12")
    with engine.begin() as conn:  # what a lost lease and the reaper's requeue leave behind
        conn.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status="queued", worker_id=None, finished_at=None, step=6, end_info=None, lease_expires_at=None)
        )
        conn.execute(delete(StepRow).where(StepRow.job_id == job_id, StepRow.step > 6))
        conn.execute(update(Attempt).where(Attempt.job_id == job_id).values(status="requeued", reason="worker_lost"))
    outcome = run_job(job_id, _context(settings, store))
    assert outcome is not None and outcome.status == "succeeded", outcome
    assert not (settings.runs_dir / job_id / "attempt-2" / "records.jsonl").exists()  # nothing was launched
    assert _steps(engine, job_id) == list(range(1, 13))
    row = _row(engine, job_id)
    assert (row.status, row.step, present(row.end_info)["steps"]) == ("succeeded", 12, 12)
    assert _attempts(engine, job_id) == [(1, "requeued", "worker_lost"), (2, "succeeded", None)]


def test_an_earlier_attempt_without_final_pt_or_its_end_record_is_trained_again(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    """No final.pt (the run died before it): the retry launches as before."""
    job_id = make_job(small_spec(max_steps=12))
    assert run_job(job_id, _context(settings, store)) == Outcome(JobStatus.SUCCEEDED)
    with engine.begin() as conn:
        conn.execute(update(Job).where(Job.id == job_id).values(status="queued", worker_id=None, finished_at=None))
    assert run_job(job_id, _context(settings, store)) == Outcome(JobStatus.SUCCEEDED)
    assert (settings.runs_dir / job_id / "attempt-2" / "records.jsonl").exists()


def test_graceful_shutdowns_do_not_use_up_max_attempts(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    """max_attempts 1, the worker shut down twice mid-job: requeued both times, then it succeeds (attempt 3)."""
    job_id = make_job(
        small_spec(max_steps=60, max_attempts=1, checkpoint_interval=5, faults={"sleep_per_step_s": 0.05})
    )
    sent: list[str] = []
    for attempt in (1, 2):
        context = _context(settings, store, enqueue=sent.append)
        thread, _ = _run_in_thread(job_id, context)
        _wait_until(functools.partial(_running_attempt, engine, job_id, attempt))
        context.shutdown.set()
        thread.join(timeout=30)
        assert _row(engine, job_id).status == "queued" and sent == [job_id] * attempt
    assert run_job(job_id, _context(settings, store, enqueue=sent.append)) == Outcome(JobStatus.SUCCEEDED)
    assert [a[1:] for a in _attempts(engine, job_id)] == [("requeued", "worker_shutdown")] * 2 + [("succeeded", None)]


def test_past_max_runtime_the_run_is_stopped_and_the_job_fails(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    job_id = make_job(small_spec(max_steps=1000, max_runtime_s=1.5, faults={"sleep_per_step_s": 0.05}))
    started = time.monotonic()
    outcome = run_job(job_id, _context(settings, store))
    assert outcome is not None and (outcome.status, outcome.reason) == ("failed", "deadline_exceeded")
    assert 1.5 <= time.monotonic() - started < 15
    row = _row(engine, job_id)
    assert (row.status, row.error_reason) == ("failed", "deadline_exceeded") and 0 < row.step < 1000
    assert "max_runtime_s of 1.5 s" in present(row.error_message)
    assert session_members(_leader_pid(Path(present(row.run_dir)))) == []


def test_the_deadline_counts_earlier_attempts(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    from datetime import timedelta

    from sqlalchemy import insert

    job_id = make_job(small_spec(max_runtime_s=60))
    start = utcnow() - timedelta(seconds=120)
    with engine.begin() as conn:  # attempt 1 ran 61 s and its worker was lost
        conn.execute(
            insert(Attempt).values(
                job_id=job_id,
                attempt=1,
                worker_id="old",
                started_at=start,
                ended_at=start + timedelta(seconds=61),
                status="failed",
                reason="worker_lost",
            )
        )
        conn.execute(update(Job).where(Job.id == job_id).values(attempt=1))
    outcome = run_job(job_id, _context(settings, store))
    assert outcome is not None and outcome.reason == "deadline_exceeded"
    assert not (settings.runs_dir / job_id / "attempt-2" / "logs" / "launcher.log").exists()  # never launched


def test_an_attempt_that_lost_its_lease_stops_its_run_and_writes_nothing(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    """A reaper recovered the job (this worker looked dead): the stale attempt stops at its next heartbeat."""
    from datetime import timedelta

    settings = settings.model_copy(update={"lease_ttl_s": 1.0})
    job_id = make_job(small_spec(max_steps=1000, faults={"sleep_per_step_s": 0.05}))
    thread, result = _run_in_thread(job_id, _context(settings, store))
    row = _wait_status(engine, job_id, "running")
    sent: list[str] = []
    recovery = Recovery(store, sent.append)
    [lease] = recovery.expired_leases(utcnow() + timedelta(hours=1))
    assert recovery.recover_expired(lease, utcnow() + timedelta(hours=1)) == "requeued"
    step_at_takeover = _row(engine, job_id).step
    thread.join(timeout=30)
    assert (
        not thread.is_alive()
        and result[0] is not None
        and result[0].reason == "worker_lost"
        and "lease lost" in present(result[0].message)
    )
    assert session_members(_leader_pid(Path(present(row.run_dir)))) == []
    row = _row(engine, job_id)
    assert (row.status, row.worker_id, row.error_reason) == ("queued", None, None)
    assert row.step <= step_at_takeover + 1 and _attempts(engine, job_id) == [(1, "failed", "worker_lost")]


@pytest.mark.parametrize(("name", "reason"), [("oom", "oom"), ("collective-timeout", "collective_timeout")])
def test_known_causes_are_typed(
    name: str, reason: str, settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    job_id = make_job(small_spec(name=name, max_steps=5))
    sent: list[str] = []
    outcome = run_job(job_id, _context(settings, store, enqueue=sent.append))
    assert outcome is not None and (outcome.status, outcome.reason) == ("failed", reason)
    assert _row(engine, job_id).status == "failed" and sent == []  # never retried
    assert _attempts(engine, job_id) == [(1, "failed", reason)]


def test_a_cancelled_job_has_no_error(settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob) -> None:
    job_id = make_job(small_spec(max_steps=1000, faults={"sleep_per_step_s": 0.05}))
    thread, _ = _run_in_thread(job_id, _context(settings, store))
    _wait_status(engine, job_id, "running")
    _set_status(engine, job_id, "cancelling")
    thread.join(timeout=30)
    row = _row(engine, job_id)
    assert (row.status, row.error_reason, row.error_message) == ("cancelled", None, None)
    assert _attempts(engine, job_id) == [(1, "cancelled", None)]


def test_a_cancel_recorded_behind_a_locked_row_stops_the_run(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    """Issue 24 item 5: the API recorded the cancel (``cancel_requests``) because the job's row was locked; the
    worker reads it as a cancel, ends the job ``cancelled`` and forgets the request."""
    job_id = make_job(small_spec(max_steps=1000, faults={"sleep_per_step_s": 0.05}))
    thread, _ = _run_in_thread(job_id, _context(settings, store))
    _wait_status(engine, job_id, "running")
    with engine.begin() as conn:
        conn.execute(insert(CancelRequest).values(job_id=job_id, requested_at=utcnow(), requested_by="tester"))
    thread.join(timeout=30)
    assert _row(engine, job_id).status == "cancelled"
    with engine.connect() as conn:
        assert conn.execute(select(CancelRequest.job_id)).all() == []


def test_records_and_checkpoint_written_after_the_worker_left_are_stored_by_the_retry(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    """A run that outlives its worker (SIGTERM checkpoint of the step in flight) leaves records nobody
    stored; the retry resumes from that checkpoint and stores them first, so no step is missing."""
    job_id = make_job(small_spec(max_steps=30, checkpoint_interval=3, faults={"sleep_per_step_s": 0.05}))
    context = _context(settings, store, enqueue=lambda _: None)
    thread, _ = _run_in_thread(job_id, context)
    _wait_until(lambda: _row(engine, job_id).step >= 6)
    context.shutdown.set()
    thread.join(timeout=30)
    stored = _steps(engine, job_id)
    first_run = settings.runs_dir / job_id / "attempt-1"
    late = [max(stored) + 1, max(stored) + 2]  # written by the dying run after the worker stopped tailing
    with (first_run / "records.jsonl").open("a") as records:
        for step in late:
            records.write(json.dumps({"type": "step", "time": time.time(), "step": step, "loss": 0.5}) + "\n")
    (first_run / "checkpoints" / f"step-{late[-1]}.pt").write_text(str(late[-1]))
    assert run_job(job_id, _context(settings, store)) == Outcome(JobStatus.SUCCEEDED)
    assert _start_record(settings.runs_dir / job_id / "attempt-2")["resumed_from_step"] == late[-1]
    assert _steps(engine, job_id) == list(range(1, 31))


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["cancel", "shutdown"])
def test_a_real_torchrun_run_stops_long_before_the_grace_and_leaves_no_traceback(
    stop: str, data_dir: Path, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    """Issue 13: 2 real CPU ranks under torchrun, a 30 s grace. The ranks checkpoint and exit within about a
    second of SIGTERM, so a cancel (or a worker shutdown, as on Ctrl-C) must end in well under the grace, and
    ``launcher.log`` must not end with torchrun's ``SignalException`` traceback (a clean stop is no crash)."""
    settings = Settings(data_dir=data_dir, worker_poll_interval_s=0.05, cancel_grace_s=30.0, allow_faults=True)
    job_id = make_job(small_spec(processes=2, max_steps=100_000, faults={"sleep_per_step_s": 0.2}))
    context = RunnerContext(settings=settings, store=store, worker_id="test-worker")  # the real torchrun command
    thread, result = _run_in_thread(job_id, context)
    _wait_until(lambda: _row(engine, job_id).step >= 2, timeout_s=180)
    started = time.monotonic()
    if stop == "cancel":
        _set_status(engine, job_id, "cancelling")  # what POST /jobs/{id}/cancel does
    else:
        context.shutdown.set()
    thread.join(timeout=60)
    seconds = time.monotonic() - started
    expected = {"cancel": ("cancelled", None), "shutdown": ("failed", "worker_shutdown")}[stop]
    assert [(o.status, o.reason) for o in result if o is not None] == [expected]
    assert seconds < settings.cancel_grace_s / 2, f"the stop took {seconds:.1f} s"
    run_dir = settings.runs_dir / job_id / "attempt-1"
    launcher = (run_dir / "logs" / "launcher.log").read_text()
    assert "SignalException" not in launcher and "Traceback" not in launcher, launcher[-3000:]
    for rank in (0, 1):
        assert "stopped by SIGTERM after step" in (run_dir / "logs" / f"rank-{rank}.log").read_text()
    assert list((run_dir / "checkpoints").glob("step-*.pt"))  # the stop checkpoint


def test_the_rows_step_follows_the_stored_records_once_per_interval_and_at_the_end(
    settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob
) -> None:
    """``HALFCAST_WORKER_PROGRESS_INTERVAL_S`` (worker/records/pacing.py): step records are stored every poll; the
    row's step waits for the interval (here longer than the run), and the run's last records set it."""
    paced = settings.model_copy(update={"worker_progress_interval_s": 60.0})
    job_id = make_job(small_spec(max_steps=40, faults={"sleep_per_step_s": 0.03}))
    thread, result = _run_in_thread(job_id, _context(paced, store))
    deadline = time.monotonic() + 30
    while len(stored := _steps(engine, job_id)) < 10:
        assert time.monotonic() < deadline and thread.is_alive(), f"only {stored} stored"
        time.sleep(0.02)
    row = _row(engine, job_id)
    assert row.status == "running" and row.step < len(stored)  # behind the records it has (set once, at the first)
    thread.join(60)
    assert result == [Outcome(JobStatus.SUCCEEDED)]
    row = _row(engine, job_id)
    assert (row.step, present(row.latest)["step"]) == (40, 40) and _steps(engine, job_id) == list(range(1, 41))
