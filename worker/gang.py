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

from contracts.status import FailureReason, JobStatus, MemberStatus
from server.db.members import Member, Members
from server.db.models import utcnow
from worker.outcomes import Outcome

log = logging.getLogger(__name__)

#: Membership renewals per lease length (as :data:`worker.lease.RENEWALS_PER_TTL`).
RENEWALS_PER_TTL = 5


class GangEnd(StrEnum):
    """How a gathering ended."""

    COMPLETE = "complete"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    SHUTDOWN = "shutdown"
    LOST = "lost"


class MemberLease:
    """The lease of one open membership, renewed every ``ttl / RENEWALS_PER_TTL``.

    Self-fencing as :class:`worker.lease.Lease` is.
    """

    def __init__(
        self, members: Members, member_id: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.members, self.member_id, self.ttl_s, self.clock = members, member_id, ttl_s, clock
        now = clock()
        self.valid_until = now + ttl_s
        self.next_renewal = now + ttl_s / RENEWALS_PER_TTL
        self.lost_reason: str | None = None

    @property
    def lost(self) -> bool:
        """Whether the membership is closed or could not be renewed before it expired."""
        return self.lost_reason is not None

    def renew_if_due(self) -> bool:
        """Renew when due; whether the membership is still held."""
        now = self.clock()
        if self.lost or now < self.next_renewal:
            return not self.lost
        try:
            renewed = self.members.renew(self.member_id, self.ttl_s)
        except Exception as exc:  # noqa: BLE001  # the database is unreachable: retry soon, give up at expiry
            log.warning("membership %d: renewal failed: %s", self.member_id, exc)
            if self.clock() >= self.valid_until:
                self.lost_reason = f"the membership could not be renewed before it expired ({exc})"
            self.next_renewal = now + min(1.0, self.ttl_s / RENEWALS_PER_TTL)
            return not self.lost
        if not renewed:
            self.lost_reason = "the membership was closed elsewhere"
            return False
        self.valid_until, self.next_renewal = now + self.ttl_s, now + self.ttl_s / RENEWALS_PER_TTL
        return True


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
