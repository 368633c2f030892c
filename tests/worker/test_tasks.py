"""The Celery side: task registration, the thin idempotent task, the worker's arguments, no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sqlalchemy import Engine, select
from worker_support import insert_job, small_spec

from halfcast.core.broker.celery_app import RUN_JOB_TASK, create_celery_app
from halfcast.core.db.engine import make_engine
from halfcast.core.db.models import Base, Job
from halfcast.core.settings import Settings
from worker.__main__ import worker_argv
from worker.store import JobStore
from worker.tasks import register_tasks

ROOT = Path(__file__).resolve().parents[2]


def _setup(data_dir: Path) -> tuple[Settings, Engine]:
    settings = Settings(data_dir=data_dir)
    engine = make_engine(settings.effective_database_url)
    Base.metadata.create_all(engine)
    return settings, engine


def test_task_is_registered_under_the_contract_name(data_dir: Path) -> None:
    app = create_celery_app(Settings(data_dir=data_dir))
    task = register_tasks(app)
    assert task.name == RUN_JOB_TASK and app.tasks[RUN_JOB_TASK].name == RUN_JOB_TASK
    assert task.acks_late is True
    assert (data_dir / "broker" / "control").is_dir()  # kombu's control folder stays under data_dir


def test_task_claims_then_drops_a_redelivered_message(data_dir: Path) -> None:
    settings, engine = _setup(data_dir)
    task = register_tasks(create_celery_app(settings))
    job_id = insert_job(engine, {**small_spec(), "bogus": 1})  # fails on the worker without launching
    assert task.apply(args=[job_id]).get() == "failed"
    assert task.apply(args=[job_id]).get() is None  # the same message again: a no-op
    with engine.connect() as conn:
        row = conn.execute(select(Job).where(Job.id == job_id)).one()
    assert (row.status, row.error_reason, row.attempt) == ("failed", "spec_invalid", 1)


def test_worker_shutdown_signal_reaches_the_runners(data_dir: Path) -> None:
    from celery.signals import worker_shutting_down

    task = register_tasks(create_celery_app(Settings(data_dir=data_dir)))
    runtime = task.halfcast_runtime
    assert not runtime.shutdown.is_set()
    worker_shutting_down.send(sender="halfcast@test", sig="TERM", how="Warm", exitcode=0)
    assert runtime.shutdown.is_set()


def test_worker_arguments_follow_the_settings() -> None:
    settings = Settings(worker_concurrency=3, queue_name="q-test")
    argv = worker_argv(settings, ["--hostname", "other@%h"])
    assert argv[0] == "worker"
    assert argv[argv.index("--pool") + 1] == "threads"
    assert argv[argv.index("--concurrency") + 1] == "3"
    assert argv[argv.index("-Q") + 1] == "q-test"
    assert argv[-2:] == ["--hostname", "other@%h"]


def test_the_celery_process_never_imports_torch(data_dir: Path) -> None:
    code = (
        "import sys\n"
        "from halfcast.core.settings import Settings\n"
        "import worker.__main__, worker.tasks, worker.runner, worker.launch.process_tree, worker.store, worker.records.tail\n"
        "from halfcast.core.broker.celery_app import create_celery_app\n"
        "from worker.tasks import register_tasks\n"
        f"register_tasks(create_celery_app(Settings(data_dir={str(data_dir)!r})))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_visibility_timeout_comes_from_the_settings() -> None:
    settings = Settings(broker_url="redis://127.0.0.1:6379/0", broker_visibility_timeout_s=5)
    app = create_celery_app(settings)
    assert app.conf.broker_transport_options == {
        "visibility_timeout": 5,
        "unacked_restore_interval": 2.5,
        "unacked_restore_throttle": 1,
    }
    assert (app.conf.task_acks_late, app.conf.worker_prefetch_multiplier, app.conf.task_reject_on_worker_lost) == (
        True,
        1,
        True,
    )


def test_the_message_is_acknowledged_right_after_the_claim(data_dir: Path, monkeypatch) -> None:
    """A claimed job's message must not wait for the end of the job (celery#5935): the lease protects the job."""
    from celery.worker import state

    from worker.messages.acks import acknowledge

    class FakeRequest:
        acknowledged = False

        def acknowledge(self) -> None:
            self.acknowledged = True

    settings, engine = _setup(data_dir)
    task = register_tasks(create_celery_app(settings))
    request = FakeRequest()
    monkeypatch.setitem(state.requests, "task-1", request)
    job_id = insert_job(engine, {**small_spec(), "bogus": 1})
    seen: list[bool] = []
    real_finish = JobStore.finish

    def finish(self, *args, **kwargs):
        seen.append(request.acknowledged)  # already acknowledged when the attempt ends
        return real_finish(self, *args, **kwargs)

    monkeypatch.setattr("worker.store.JobStore.finish", finish)
    assert task.apply(args=[job_id], task_id="task-1").get() == "failed"
    assert seen == [True]
    assert acknowledge("no-such-task") is False and acknowledge(None) is False


def test_a_database_error_before_the_claim_retries_the_task(data_dir: Path, monkeypatch) -> None:
    from celery.exceptions import Retry
    from sqlalchemy.exc import OperationalError

    task = register_tasks(create_celery_app(Settings(data_dir=data_dir)))
    retries: list[float] = []

    def down(*_args, **_kwargs):
        raise OperationalError("SELECT 1", {}, ConnectionError("database down"))

    def retry(*, exc, countdown, throw=True):
        retries.append(countdown)
        return Retry(exc=exc)

    monkeypatch.setattr("worker.tasks.run_job", down)
    monkeypatch.setattr(task, "retry", retry)
    result = task.apply(args=["some-job"])
    assert retries == [5.0] and result.state == "RETRY"


def test_the_reaper_starts_when_the_worker_is_ready_and_stops_at_shutdown(data_dir: Path) -> None:
    settings, _ = _setup(data_dir)
    task = register_tasks(create_celery_app(settings.model_copy(update={"reaper_interval_s": 0.05})))
    runtime = task.halfcast_runtime
    runtime.on_ready()
    thread = runtime.reaper().thread
    assert thread is not None and thread.is_alive()
    runtime.on_shutdown()
    thread.join(timeout=10)
    assert not thread.is_alive()
