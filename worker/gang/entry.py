"""Where a task's message leads for multi-node jobs: claim as node 0, join a gang, or neither.

- A ``queued`` job with ``nodes`` > 1 is claimed as ``gathering`` (:meth:`GangEntry.run_queued`):
  this worker becomes node 0, holds a rendezvous port on its address for the attempt
  (:mod:`worker.gang.ports`), opens rank 0 and sends the
  job's message ``nodes - 1`` more times; each message lets one more worker join.
- A message of a ``gathering`` job that still needs nodes joins it (:meth:`GangEntry.join`). A
  worker that cannot join now (no free slot, or it already holds an open membership: node 0's own
  worker, whose other slots take the messages it sends too) hands the message back after a short
  pause, so another worker gets it; the gang never loses a message it still needs.
- Fair ordering: before it claims a ``queued`` job, a worker that sees an *older* ``gathering``
  job still needing a node it could run joins that job instead and sends the newer job's message
  back to the queue. A stream of one-node jobs therefore never starves a forming gang: every
  free worker that takes a newer message fills the older gang first. Gangs are filled oldest
  first too, and a gang that cannot fill in ``gang_timeout_s`` lets go of its workers.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from halfcast.contracts.status import JobStatus, MemberStatus
from halfcast.core.db.members import GatheringJob, Members, spec_nodes
from halfcast.core.db.models import Job
from halfcast.core.settings import Settings
from worker.gang.attempt import Node0Attempt
from worker.gang.launch import route_address
from worker.gang.member import MemberRun
from worker.gang.ports import NoRendezvousPortError, ephemeral_range, reserve_port, warn_if_ephemeral
from worker.lifecycle.outcomes import Outcome
from worker.resources.slots import Placement
from worker.runner import RunnerContext, run_job

log = logging.getLogger(__name__)

#: Runs a one-node job (:func:`worker.runner.run_job`).
OneNode = Callable[[str, RunnerContext], Outcome | None]
#: Seconds a worker that cannot join a gang now waits before it hands the message back.
HAND_BACK_PAUSE_S = 1.0


@dataclass(frozen=True)
class QueuedJob:
    """A job's status, nodes and creation time, as a task first reads them."""

    status: str
    nodes: int
    created_at: datetime


class GangEntry:
    """The multi-node paths of one worker's tasks (see the module's docstring)."""

    def __init__(self, settings: Settings, members: Members, can_ever_place: Callable[[int], bool]) -> None:
        self.settings = settings
        self.members = members
        self.can_ever_place = can_ever_place
        self._address: str | None = None
        self._lock = threading.Lock()

    def address(self) -> str:
        """The address the other nodes reach this worker at (``HALFCAST_WORKER_HOST_ADDRESS`` or the route to the database)."""
        with self._lock:
            if self._address is None:
                self._address = self.settings.worker_host_address or route_address(self.settings.effective_database_url)
            return self._address

    def job(self, job_id: str) -> QueuedJob | None:
        """The job's status, nodes and creation time (``None``: no such job)."""
        with self.members.engine.connect() as conn:
            row = conn.execute(select(Job.status, Job.spec, Job.created_at).where(Job.id == job_id)).one_or_none()
        return None if row is None else QueuedJob(row.status, spec_nodes(job_id, row.spec), row.created_at)

    def gang_to_join(self, job_id: str, worker_id: str) -> GatheringJob | None:
        """The gang this message should make the worker join: its own job's, or an older one (fair ordering).

        A ``gathering`` job's own message leads to its gang for as long as the gang needs nodes, even
        when this worker cannot join it (it holds an open membership, node 0's own worker say, or has
        no slot for it): :meth:`join` then declines and the task hands the message back for another
        worker. Dropping it would leave the gang a node short until ``gang_timeout_s``.
        """
        job = self.job(job_id)
        if job is None:
            return None
        if job.status == JobStatus.GATHERING:
            return next((gang for gang in self.members.gathering() if gang.job_id == job_id), None)
        if job.status != JobStatus.QUEUED or self.members.open_membership(worker_id) is not None:
            return None
        older = self.members.gathering(created_before=job.created_at)
        return next((gang for gang in older if self.can_ever_place(gang.gpus)), None)

    def run_queued(self, job_id: str, context: RunnerContext, one_node: OneNode = run_job) -> Outcome | None:
        """Run a queued job in ``context``'s slot: as node 0 of its gang when ``nodes`` > 1, else with ``one_node``."""
        job = self.job(job_id)
        if job is None or job.nodes <= 1:
            return one_node(job_id, context)
        return self._run_node0(job_id, job.nodes, context)

    def _run_node0(self, job_id: str, nodes: int, context: RunnerContext) -> Outcome | None:
        settings = context.settings
        host = self.address()
        _check_port_range(settings.rendezvous_port_min, settings.rendezvous_port_max)
        try:
            port = reserve_port(
                host, settings.rendezvous_port_min, settings.rendezvous_port_max, settings.resolved_gpu_lock_dir
            )
        except NoRendezvousPortError as exc:
            log.warning("job %s: %s: its message goes back to the queue", job_id, exc)
            self._send(context, job_id, 1)
            return None
        with port:
            return self._node0_with_port(job_id, nodes, context, host, port.port)

    def _node0_with_port(self, job_id: str, nodes: int, context: RunnerContext, host: str, port: int) -> Outcome | None:
        settings = context.settings
        claim = context.store.claim(
            job_id,
            context.worker_id,
            settings.runs_dir,
            settings.lease_ttl_s,
            gpus=context.gpus,
            status=JobStatus.GATHERING,
        )
        if claim is None:
            log.info("job %s is not queued (redelivered, duplicate or cancelled): message dropped", job_id)
            return None
        context.on_claimed()
        member = self.members.open_node0(job_id, claim.attempt, context.worker_id, host, port, settings.lease_ttl_s)
        if member is None:  # this worker took another gang's membership meanwhile
            self.members.disband(job_id, claim.attempt, context.worker_id)
            self._send(context, job_id, 1)
            return None
        log.info(
            "job %s: attempt %d: node 0 of %d on %s; rendezvous %s:%s",
            job_id,
            claim.attempt,
            nodes,
            context.worker_id,
            host,
            member.rendezvous_port,
        )
        self._send(context, job_id, nodes - 1)
        return Node0Attempt(claim, context, member, nodes).run()

    @staticmethod
    def _send(context: RunnerContext, job_id: str, count: int) -> None:
        for _ in range(count):
            if context.enqueue is not None:
                context.enqueue(job_id)

    def join(self, gang: GatheringJob, context: RunnerContext, placement: Placement | None) -> MemberStatus | None:
        """Join ``gang`` in ``placement``'s slot and run the membership; ``None`` if it could not join.

        It cannot without a slot (``placement`` ``None``), while this worker holds an open membership
        (a worker is one node of one gang at a time), or once the gang is full or no longer gathering.
        """
        if placement is None:
            log.info("job %s: no free slot here for one of its nodes (%d GPU(s) each)", gang.job_id, gang.gpus)
            return None
        if (held := self.members.open_membership(context.worker_id)) is not None:
            log.info(
                "job %s: %s already is node %d of job %s: it cannot be another node",
                gang.job_id,
                context.worker_id,
                held.node_rank,
                held.job_id,
            )
            return None
        member = self.members.join(gang.job_id, context.worker_id, self.address(), context.settings.lease_ttl_s)
        if member is None:
            log.info(
                "job %s: %s could not join its gang (full, or no longer gathering)", gang.job_id, context.worker_id
            )
            return None
        log.info(
            "job %s: attempt %d: %s joined as node %d", gang.job_id, member.attempt, context.worker_id, member.node_rank
        )
        context.on_claimed()
        return MemberRun(member, context, gang.nodes).run()


@functools.cache
def _check_port_range(first: int, last: int) -> None:
    """Warn once per process when the rendezvous ports overlap the kernel's ephemeral range."""
    warn_if_ephemeral(first, last, ephemeral_range())
