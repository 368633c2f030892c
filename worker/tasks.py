"""Celery tasks of the worker. ``register_tasks(app)`` adds them to an app; nothing at import time.

``RUN_JOB_TASK`` is thin and idempotent: it hands the job id to
:func:`worker.runner.run_job`, which claims the job with a compare-and-set before
doing anything, so a redelivered or duplicate message is a logged no-op
(celery#5935); the message is acknowledged right after the claim
(:mod:`worker.messages.acks`). If the database cannot be reached for the claim, the task is
retried later rather than dropped. The training itself runs in a torchrun
subprocess; this process never imports torch (celery#6036).

Before the claim, the task takes a slot for the job (:mod:`worker.resources.placement`): a
CPU slot, or exactly ``gpus`` of the worker's GPUs (:mod:`worker.resources.gpus`,
:mod:`worker.resources.gpu_locks`), held until the attempt ends. If none frees up in time the
message goes back to the queue (a retry with no delay), the job still ``queued``.

When the worker is ready it starts the reaper (:mod:`worker.lifecycle.reaper`) and registers
itself with a heartbeat (:mod:`worker.roster`); a warm shutdown stops them and the
running attempts, and deregisters the worker.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from celery import Celery, Task
from celery.signals import worker_ready, worker_shutdown, worker_shutting_down
from sqlalchemy.exc import DBAPIError

from halfcast.core.broker.celery_app import RUN_JOB_TASK
from halfcast.core.db.engine import make_engine
from halfcast.core.db.members import GatheringJob, Members
from halfcast.core.settings import Settings
from worker.gang.entry import HAND_BACK_PAUSE_S, GangEntry
from worker.lifecycle.reaper import Reaper
from worker.lifecycle.recovery import Recovery
from worker.messages.acks import acknowledge
from worker.messages.broker_watch import BrokerWatch, queued_job_ids, redis_marker_store
from worker.messages.holds import MessageHolds
from worker.messages.message_audit import MessageAudit, unowned_queued_job_ids
from worker.resources.gpu_locks import GpuLocks
from worker.resources.gpus import discover_gpus
from worker.resources.placement import Placer, SlotUnavailable
from worker.resources.slots import Placement, Slots
from worker.roster import Heartbeat, WorkerInfo, WorkerRoster
from worker.runner import RunnerContext, run_job
from worker.store import JobStore
from worker.warm.pool import WarmPool

log = logging.getLogger(__name__)

#: Seconds before a task whose claim met a database error runs again.
CLAIM_RETRY_S = 5.0
#: Seconds a clean shutdown waits for the heartbeat thread to deregister the worker.
DEREGISTER_WAIT_S = 5.0


class WorkerRuntime:
    """Per-process state shared by the task's threads: settings, store, broker, shutdown flag, reaper."""

    def __init__(self, settings: Settings, app: Celery) -> None:
        self.settings = settings
        self.app = app
        self.shutdown = threading.Event()
        self._store: JobStore | None = None
        self._reaper: Reaper | None = None
        self._slots: Slots | None = None
        self._heartbeat: Heartbeat | None = None
        self._warm: WarmPool | None = None
        self._gangs: GangEntry | None = None
        self._lock = threading.Lock()
        self._slots_lock = threading.Lock()

    @property
    def store(self) -> JobStore:
        """The job store (the engine is created on first use, not at registration)."""
        with self._lock:
            if self._store is None:
                self._store = JobStore(
                    make_engine(
                        self.settings.effective_database_url, timeouts=self.settings.worker_statement_timeouts()
                    )
                )
            return self._store

    @property
    def holds(self) -> MessageHolds:
        """Message holds of queued jobs, on the store's engine."""
        return MessageHolds(self.store.engine)

    def enqueue(self, job_id: str) -> None:
        """Send ``RUN_JOB_TASK(job_id)`` to the queue (a retry after a lost worker)."""
        self.app.send_task(RUN_JOB_TASK, args=[job_id], queue=self.settings.queue_name)

    def worker_id(self, hostname: str | None) -> str:
        """This worker's identity, the owner of its leases: ``<hostname>/<pid>``."""
        return f"{hostname or 'worker'}/{os.getpid()}"

    def context(
        self, hostname: str | None, task_id: str | None = None, placement: Placement | None = None
    ) -> RunnerContext:
        """A runner context for one task in ``placement``; its message is acknowledged once the job is claimed."""
        return RunnerContext(
            settings=self.settings,
            store=self.store,
            worker_id=self.worker_id(hostname),
            shutdown=self.shutdown,
            enqueue=self.enqueue,
            on_claimed=partial(acknowledge, task_id),
            gpus=placement.gpus if placement else (),
            gpu_lock_fds=placement.lock_fds if placement else (),
            warm=self.warm(),
        )

    def warm(self) -> WarmPool | None:
        """The warm standby (:mod:`worker.warm`), created once; ``None`` with ``HALFCAST_WARM_START=0``."""
        if not self.settings.warm_start:
            return None
        with self._lock:
            if self._warm is None:
                self._warm = WarmPool(self.settings.runs_dir, self.shutdown, nice=self.settings.run_nice)
            return self._warm

    def slots(self) -> Slots:
        """This worker's slots; its GPUs are discovered on first use (raises ``ValueError`` for a bad setting)."""
        with self._slots_lock:
            if self._slots is None:
                gpus = discover_gpus(self.settings.worker_gpus)
                log.info("GPUs for jobs: %s; CPU jobs at once: %d", gpus or "none", self.settings.worker_concurrency)
                self._slots = Slots(
                    self.settings.worker_concurrency, GpuLocks(self.settings.resolved_gpu_lock_dir, gpus)
                )
            return self._slots

    def placer(self) -> Placer:
        """Finds a slot for a job before it is claimed (waits up to ``worker_slot_wait_s``)."""
        settings = self.settings
        return Placer(
            self.slots(),
            self.store.queued_gpus,
            settings.worker_slot_wait_s,
            settings.worker_poll_interval_s,
            self.shutdown,
        )

    def heartbeat(self, hostname: str | None) -> Heartbeat:
        """The roster heartbeat of this worker (created once)."""
        slots, store = self.slots(), self.store
        with self._lock:
            if self._heartbeat is None:
                info = WorkerInfo(
                    self.worker_id(hostname),
                    socket.gethostname(),
                    os.getpid(),
                    slots.gpus,
                    slots.concurrency,
                    model_roots=[str(root) for root in self.settings.model_roots],
                    data_roots=[str(root) for root in self.settings.data_roots],
                )
                roster = WorkerRoster(store.engine, info, self.settings.worker_forget_s)
                self._heartbeat = Heartbeat(roster, self.settings.worker_heartbeat_s, self.shutdown)
            return self._heartbeat

    def gangs(self) -> GangEntry:
        """The multi-node paths of this worker's tasks (:mod:`worker.gang.entry`), created once."""
        slots, store = self.slots(), self.store
        with self._lock:
            if self._gangs is None:
                self._gangs = GangEntry(self.settings, Members(store.engine), slots.can_ever_place)
            return self._gangs

    def reaper(self) -> Reaper:
        """The reaper of this worker (created once)."""
        store = self.store
        with self._lock:
            if self._reaper is None:
                self._reaper = Reaper(
                    Recovery(store, self.enqueue),
                    self.settings.reaper_interval_s,
                    self.shutdown,
                    self._broker_watch(store),
                    self._recover_holds,
                    self._message_audit(store),
                )
            return self._reaper

    def _recover_holds(self) -> list[str]:
        """Send again the messages of queued jobs held by workers that are not live (:mod:`worker.messages.holds`)."""
        return self.holds.recover(self.settings.worker_live_s, self.enqueue)

    def _broker_watch(self, store: JobStore) -> BrokerWatch | None:
        """A watch for a Redis broker that lost its data; ``None`` for the embedded (on-disk) broker."""
        redis = redis_marker_store(self.settings.effective_broker_url)
        if redis is None:
            return None
        return BrokerWatch(redis, self.settings.queue_name, partial(queued_job_ids, store.engine), self.enqueue)

    def _message_audit(self, store: JobStore) -> Callable[[], list[str]] | None:
        """Re-sends the messages a frozen worker took (:mod:`worker.messages.message_audit`); ``None`` unless Redis."""
        redis = redis_marker_store(self.settings.effective_broker_url)
        if redis is None:
            return None
        queued = partial(unowned_queued_job_ids, store.engine)
        return MessageAudit(redis, self.settings.queue_name, queued, self.enqueue).check

    def on_ready(self, sender: Any = None, **_: Any) -> None:
        """Celery ``worker_ready`` receiver: start the reaper (its first pass runs at once) and the heartbeat."""
        log.info("starting the reaper (every %.1f s)", self.settings.reaper_interval_s)
        if (warm := self.warm()) is not None:
            warm.start()
        self.reaper().start()
        self.heartbeat(getattr(sender, "hostname", None)).start()

    def on_shutdown(self, **_: Any) -> None:
        """Celery ``worker_shutting_down`` receiver: the reaper stops; running attempts stop their runs."""
        log.info("worker shutting down: stopping running jobs")
        self.shutdown.set()

    def on_stopped(self, **_: Any) -> None:
        """Celery ``worker_shutdown`` receiver (after a warm shutdown): wait for the worker's deregistration."""
        self.shutdown.set()
        if self._heartbeat is not None and not self._heartbeat.join(DEREGISTER_WAIT_S):
            log.warning("worker roster: deregistration did not finish in %.0f s", DEREGISTER_WAIT_S)


def register_tasks(app: Celery) -> Task:
    """Register ``RUN_JOB_TASK`` on ``app`` (settings from ``app.conf.halfcast_settings``); return the task."""
    settings: Settings = app.conf.get("halfcast_settings") or Settings()
    runtime = WorkerRuntime(settings, app)
    worker_shutting_down.connect(runtime.on_shutdown, weak=False)
    worker_ready.connect(runtime.on_ready, weak=False)
    worker_shutdown.connect(runtime.on_stopped, weak=False)

    @app.task(name=RUN_JOB_TASK, bind=True, acks_late=True, ignore_result=True, max_retries=None)
    def run_job_task(self: Task, job_id: str) -> str | None:
        """Run one attempt of ``job_id`` in a free slot (a no-op unless the job is ``queued``).

        The task first records that this worker holds the job's message (:mod:`worker.messages.holds`);
        the claim clears the hold, and so does handing the message back.
        """
        job_id, worker_id = str(job_id), runtime.worker_id(self.request.hostname)
        try:
            if (gang := runtime.gangs().gang_to_join(job_id, worker_id)) is not None:
                return _join_gang(self, runtime, job_id, gang)
            if not runtime.holds.hold(job_id, worker_id):
                log.info("job %s is not queued (redelivered, duplicate or cancelled): message dropped", job_id)
                return None
            log.info("job %s: message taken by %s", job_id, worker_id)
            placement = runtime.placer().place(job_id)
            if placement is None:
                log.info("job %s is not queued (redelivered, duplicate or cancelled): message dropped", job_id)
                return None
            with placement:
                outcome = runtime.gangs().run_queued(
                    job_id, runtime.context(self.request.hostname, self.request.id, placement), run_job
                )
        except SlotUnavailable as exc:
            log.info("%s: handing the message back to the queue", exc)
            raise _hand_back(self, runtime, job_id, worker_id, exc, countdown=0) from exc
        except DBAPIError as exc:  # only the hold, placement and the claim can raise: the attempt records its errors
            log.warning("job %s: database error before the claim; retrying in %.0f s: %s", job_id, CLAIM_RETRY_S, exc)
            raise _hand_back(self, runtime, job_id, worker_id, exc, countdown=CLAIM_RETRY_S) from exc
        return outcome.status if outcome else None

    run_job_task.halfcast_runtime = runtime
    return run_job_task


def _join_gang(task: Task, runtime: WorkerRuntime, job_id: str, gang: GatheringJob) -> str | None:
    """Join ``gang`` (its own message, or an older gang before the newer job ``job_id``: fair ordering).

    The newer job's message goes back to the queue first. A gang's own message that cannot
    join here now goes back after a pause, for another worker.
    """
    own = gang.job_id == job_id
    if not own:
        log.info("job %s: the older gathering job %s needs a node: joining it first", job_id, gang.job_id)
        task.retry(countdown=0, throw=False)
    placement = runtime.slots().try_place(gang.gpus)
    try:
        status = runtime.gangs().join(
            gang, runtime.context(task.request.hostname, task.request.id, placement), placement
        )
    finally:
        if placement is not None:
            placement.release()
    if status is None and own:
        log.info("job %s: handing its message back in %.1f s, for another worker", job_id, HAND_BACK_PAUSE_S)
        runtime.shutdown.wait(HAND_BACK_PAUSE_S)
        raise task.retry(countdown=0, throw=False)
    return status


def _hand_back(
    task: Task, runtime: WorkerRuntime, job_id: str, worker_id: str, exc: Exception, countdown: float
) -> BaseException:
    """Send the job a new message (Celery's retry), then clear this worker's hold; the exception to raise.

    The hold is cleared only after the new message is out, and only if it is still this
    worker's (the worker that took the new message may already hold it).
    """
    try:
        retry = task.retry(exc=exc, countdown=countdown, throw=False)
    finally:
        try:
            runtime.holds.release(job_id, worker_id)
        except DBAPIError as db_exc:
            log.warning("job %s: could not clear this worker's message hold: %s", job_id, db_exc)
    return retry
