"""Gang formation and the peer verdicts of a multi-node job (docs/worker.md, "Multi-node jobs").

Node 0 claimed the job (``gathering``) and holds rank 0 of the gang; :class:`Gathering` waits,
renewing the job's lease and its membership, until every node rank is held by an open
membership (then ``gathering`` → ``starting``: every member launches), or the gang times out
(``distributed.gang_timeout_s``: every membership is released and the job goes back to
``queued``, so two jobs that each hold part of the cluster never deadlock), or the job is
cancelled, or the worker shuts down. :func:`peer_verdict` turns the other nodes' memberships
into the outcome that ends node 0's attempt: a lost node (its worker stopped renewing its
membership) is ``worker_lost`` (retried on a new gang from the newest checkpoint), a node whose
torchrun exited otherwise than 0 is ``rank_failed``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from halfcast.contracts.status import FailureReason, JobStatus, MemberStatus
from halfcast.core.db.members import Member, Members
from halfcast.core.db.models import utcnow
from worker.lifecycle.lease import RenewedLease
from worker.lifecycle.outcomes import Outcome

log = logging.getLogger(__name__)


class GangEnd(StrEnum):
    """How a gathering ended."""

    COMPLETE = "complete"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    SHUTDOWN = "shutdown"
    LOST = "lost"


class MemberLease(RenewedLease):
    """The lease of one open membership (``job_members.lease_expires_at``), self-fencing as the job's is."""

    def __init__(
        self, members: Members, member_id: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.members, self.member_id = members, member_id
        super().__init__(
            lambda: members.renew(member_id, ttl_s),
            ttl_s,
            holder=f"membership {member_id}",
            noun="membership",
            taken_over="the membership was closed elsewhere",
            clock=clock,
        )


@dataclass
class Gathering:
    """Node 0's wait for its gang (see the module's docstring)."""

    members: Members
    job_id: str
    attempt: int
    owner: str
    nodes: int
    gang_timeout_s: float
    poll_s: float
    renew_job: Callable[[], bool]
    renew_member: Callable[[], bool]
    job_status: Callable[[], str | None]
    shutdown: threading.Event

    def wait(self) -> GangEnd:
        """Wait for the gang; on ``complete`` the job is ``starting`` (compare-and-set done here)."""
        deadline = time.monotonic() + self.gang_timeout_s
        while True:
            if not (self.renew_job() and self.renew_member()):
                return GangEnd.LOST
            status = self.job_status()
            if status == JobStatus.CANCELLING:
                return GangEnd.CANCELLED
            if status != JobStatus.GATHERING:
                return GangEnd.LOST
            held = [m for m in self.members.of_attempt(self.job_id, self.attempt) if m.open]
            if len(held) >= self.nodes:
                return GangEnd.COMPLETE if self.members.launch(self.job_id, self.attempt, self.owner) else GangEnd.LOST
            if self.shutdown.is_set():
                return GangEnd.SHUTDOWN
            if time.monotonic() >= deadline:
                return GangEnd.TIMED_OUT
            self.shutdown.wait(self.poll_s)


def peer_verdict(members: Sequence[Member], node_rank: int = 0) -> Outcome | None:
    """The outcome another node's membership forces on this node's attempt, or ``None`` while all are well.

    A lost node (closed ``lost``, or open with its lease expired) comes first: it is ``worker_lost``,
    whatever else failed after it.
    """
    now = utcnow()
    peers = [member for member in members if member.node_rank != node_rank]
    for member in peers:
        if member.status == MemberStatus.LOST or member.expired(now):
            message = f"node {member.node_rank} (worker {member.worker_id}) stopped renewing its membership: lost"
            return Outcome(JobStatus.FAILED, FailureReason.WORKER_LOST, message)
    for member in peers:
        if member.status == MemberStatus.FAILED:
            message = (
                f"node {member.node_rank} (worker {member.worker_id}): its torchrun exited with {member.exit_code}"
            )
            return Outcome(JobStatus.FAILED, FailureReason.RANK_FAILED, message)
    return None


def all_exited(members: Sequence[Member], nodes: int) -> bool:
    """Whether every one of ``nodes`` nodes' torchrun exited 0."""
    exited = {member.node_rank for member in members if member.status == MemberStatus.EXITED and member.exit_code == 0}
    return exited == set(range(nodes))


def settled(members: Sequence[Member], node_rank: int = 0) -> bool:
    """Whether no other node is still open with a live lease (each has ended or is lost)."""
    now = utcnow()
    return all(not member.open or member.expired(now) for member in members if member.node_rank != node_rank)
