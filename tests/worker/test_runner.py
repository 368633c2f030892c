"""The runner's state machine against a fake trainer: every path ends in the right terminal status."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from worker_support import MakeJob, fake_command, small_spec
from sqlalchemy import Engine, select, update

from server.db.models import Job, StepRecord
from server.settings import Settings
from trainer.spec import JobSpec
from worker.launch import RunProcess, session_members
from worker.runner import Outcome, RunnerContext, run_job
from worker.store import JobStore


def _context(settings: Settings, store: JobStore, command=fake_command) -> RunnerContext:  # type: ignore[no-untyped-def]
    return RunnerContext(settings=settings, store=store, worker_id="test-worker", build_command=command)


def _row(engine: Engine, job_id: str) -> Job:
    with engine.connect() as conn:
        return conn.execute(select(Job).where(Job.id == job_id)).one()  # type: ignore[return-value]


def _steps(engine: Engine, job_id: str) -> list[int]:
    with engine.connect() as conn:
        query = select(StepRecord.step).where(StepRecord.job_id == job_id).order_by(StepRecord.step)
        return list(conn.execute(query).scalars())


def test_success_stores_every_step_latest_and_eval(settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob) -> None:
    job_id = make_job(small_spec(max_steps=12))
    outcome = run_job(job_id, _context(settings, store))
    assert outcome == Outcome("succeeded")
    row = _row(engine, job_id)
    assert (row.status, row.step, row.error_reason) == ("succeeded", 12, None)
    assert row.latest["step"] == 12 and "type" not in row.latest
    assert row.eval == {"step": 12, "time": row.eval["time"], "loss": 0.1, "accuracy": 0.95}
    assert _steps(engine, job_id) == list(range(1, 13))
    run_dir = settings.runs_dir / job_id / "attempt-1"
    assert row.run_dir == str(run_dir)
    assert JobSpec.model_validate_json((run_dir / "spec.json").read_text()).max_steps == 12
    assert (run_dir / "logs" / "launcher.log").exists()


def test_a_second_message_for_the_job_is_dropped(settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob) -> None:
    job_id = make_job()
    assert run_job(job_id, _context(settings, store)) == Outcome("succeeded")
    assert run_job(job_id, _context(settings, store)) is None
    assert _row(engine, job_id).attempt == 1
    assert sorted(p.name for p in (settings.runs_dir / job_id).iterdir()) == ["attempt-1"]


def test_error_json_gives_its_reason_message_and_log_tail(settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob) -> None:
    job_id = make_job(small_spec(name="typed-error"))
    outcome = run_job(job_id, _context(settings, store))
    assert outcome is not None and (outcome.status, outcome.reason) == ("failed", "nonfinite_gradients")
    row = _row(engine, job_id)
    assert (row.status, row.error_reason) == ("failed", "nonfinite_gradients")
    assert "gradients were non-finite on 50 steps (rank 0)" in row.error_message
    assert "giving up: non-finite gradients" in row.error_message  # the log tail


def test_a_crash_is_rank_failed_with_the_traceback(settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob) -> None:
    job_id = make_job(small_spec(max_steps=10, faults={"raise_at_step": 4}))
    run_job(job_id, _context(settings, store))
    row = _row(engine, job_id)
    assert (row.status, row.error_reason, row.step) == ("failed", "rank_failed", 3)
    assert "exited with exit code 1" in row.error_message
    assert "RuntimeError: injected failure at step 4" in row.error_message
    assert _steps(engine, job_id) == [1, 2, 3]


@pytest.mark.parametrize("name", ["no-end", "partial"])
def test_exit_0_without_an_end_record_is_a_failure(name: str, settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob) -> None:
    job_id = make_job(small_spec(name=name))
    run_job(job_id, _context(settings, store))
    row = _row(engine, job_id)
    assert (row.status, row.error_reason) == ("failed", "rank_failed")
    assert "exited 0 without an end record" in row.error_message


def test_an_unstartable_command_is_launch_failed(settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob, tmp_path: Path) -> None:
    job_id = make_job()
    run_job(job_id, _context(settings, store, lambda *_: [str(tmp_path / "missing-python")]))
    row = _row(engine, job_id)
    assert (row.status, row.error_reason) == ("failed", "launch_failed")


def test_a_stored_spec_that_no_longer_validates_is_spec_invalid(settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob) -> None:
    job_id = make_job({**small_spec(), "bogus": 1})
    run_job(job_id, _context(settings, store))
    row = _row(engine, job_id)
    assert (row.status, row.error_reason) == ("failed", "spec_invalid")
    assert "bogus" in row.error_message


def test_records_written_just_before_exit_are_drained(settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob, monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor reads once more after the exit: nothing the trainer wrote last is lost."""
    monkeypatch.setattr(RunProcess, "poll", lambda self: self.popen.wait())  # the exit is seen only after it happened
    job_id = make_job(small_spec(max_steps=7))
    assert run_job(job_id, _context(settings, store)) == Outcome("succeeded")
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
    leader = _leader_pid(Path(row.run_dir))
    assert len(session_members(leader)) >= 2  # the trainer and its SIGTERM-ignoring child
    _set_status(engine, job_id, "cancelling")  # what POST /jobs/{id}/cancel does
    thread.join(timeout=30)
    assert result == [Outcome("cancelled", None, "cancelled by request")]
    row = _row(engine, job_id)
    assert (row.status, row.error_reason) == ("cancelled", None) and row.finished_at is not None
    assert session_members(leader) == []


def test_worker_shutdown_stops_the_run_and_fails_the_job(settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob) -> None:
    job_id = make_job(small_spec(max_steps=1000, faults={"sleep_per_step_s": 0.1}))
    context = _context(settings, store)
    thread, result = _run_in_thread(job_id, context)
    row = _wait_status(engine, job_id, "running")
    leader = _leader_pid(Path(row.run_dir))
    context.shutdown.set()
    thread.join(timeout=30)
    assert _row(engine, job_id).error_reason == "worker_lost"
    assert session_members(leader) == []


def test_an_unexpected_error_kills_the_run_and_fails_the_job(settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = make_job(small_spec(max_steps=1000, faults={"sleep_per_step_s": 0.1}))
    calls = {"n": 0}
    original = store.record_progress

    def flaky(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 3:
            raise ConnectionError("database went away")
        return original(*args, **kwargs)

    monkeypatch.setattr(store, "record_progress", flaky)
    run_job(job_id, _context(settings, store))
    row = _row(engine, job_id)
    assert (row.status, row.error_reason) == ("failed", "worker_error")
    assert "ConnectionError: database went away" in row.error_message
    assert session_members(_leader_pid(Path(row.run_dir))) == []


def test_cancel_before_launch_starts_nothing(settings: Settings, store: JobStore, engine: Engine, make_job: MakeJob, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = make_job()
    real_claim = store.claim

    def claim_then_cancel(*args, **kwargs):  # type: ignore[no-untyped-def]
        claim = real_claim(*args, **kwargs)
        _set_status(engine, job_id, "cancelling")
        return claim

    monkeypatch.setattr(store, "claim", claim_then_cancel)
    assert run_job(job_id, _context(settings, store)).status == "cancelled"  # type: ignore[union-attr]
    assert not (settings.runs_dir / job_id / "attempt-1" / "logs" / "launcher.log").exists()  # never launched


def _wait_until(predicate, timeout_s: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _leader_pid(run_dir: Path) -> int:
    """The pid of the run's leader (the fake trainer writes it)."""
    return int((run_dir / "trainer.pid").read_text())
