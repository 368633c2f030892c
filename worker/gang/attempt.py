"""Node 0's attempt of a multi-node job: the one-node attempt (:class:`worker.runner.Attempt`) plus its gang.

Node 0 prepares the run directory as any attempt does, then, right before its launch, waits
for its gang (:class:`worker.gang.formation.Gathering`) and writes the launch file the other nodes read
(:mod:`worker.gang.plan`: the checkpoint every node resumes from). While the run goes on, every
poll also reads the other nodes' memberships: a lost or failed node stops the run at once
(:func:`worker.gang.formation.peer_verdict`). When its own torchrun has ended, node 0 closes its own
membership (the other nodes stop on a failure) and waits, at most a lease length and the
cancel grace, until every other node has ended or is lost. ``succeeded`` needs the trainer's
``end`` record (global rank 0, in the shared run directory) and every node's torchrun exiting
0; a partial run never succeeds, whatever torchrun's exit status.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

from halfcast.contracts.spec import JobSpec
from halfcast.contracts.status import FailureReason, JobStatus, MemberStatus
from halfcast.core.db.members import Member, Members
from worker.gang.formation import GangEnd, Gathering, MemberLease, all_exited, peer_verdict, settled
from worker.gang.launch import NodePlan, gang_command, node_environment
from worker.gang.plan import WARM_WAIT_S, GangLauncher, write_plan
from worker.launch.process_tree import RunProcess, start_run
from worker.lifecycle.outcomes import Outcome
from worker.runner import Attempt, RunnerContext
from worker.store import Claim

log = logging.getLogger(__name__)

#: Seconds between two reads of the other nodes' memberships while the run goes on.
PEER_POLL_S = 0.5
#: Reasons of node 0's own failure that a lost or failed peer explains better (the peer's verdict wins).
PEER_EXPLAINED = frozenset(
    {
        FailureReason.RANK_FAILED,
        FailureReason.COLLECTIVE_TIMEOUT,
        FailureReason.LAUNCH_FAILED,
        FailureReason.NO_UPDATE_APPLIED,
    }
)


class Node0Attempt(Attempt):
    """Node 0's attempt (see the module's docstring)."""

    def __init__(self, claim: Claim, context: RunnerContext, member: Member, nodes: int) -> None:
        assert member.host_address is not None and member.rendezvous_port is not None
        self.plan = NodePlan(
            claim.job_id, claim.attempt, 0, nodes, member.host_address, member.rendezvous_port, member.host_address
        )
        super().__init__(claim, replace(context, build_command=partial(_node_command, plan=self.plan)))
        self.members = Members(context.store.engine)
        self.member = member
        self.member_lease = MemberLease(self.members, member.id, context.settings.lease_ttl_s)
        self.nodes = nodes
        self.resume_from: str | None = None
        self.gang_timeout_s = 0.0
        self._next_peer_read = 0.0
        self.launcher = GangLauncher.TORCHRUN

    def _command(self, spec: JobSpec) -> list[str]:
        command = super()._command(spec)
        if "--resume-from" in command:
            self.resume_from = command[command.index("--resume-from") + 1]
        self.gang_timeout_s = spec.effective_distributed.gang_timeout_s
        return command

    def _environment(self, spec: JobSpec) -> dict[str, str]:
        return node_environment(super()._environment(spec), self.plan.local_address)

    def _choose_launcher(self) -> GangLauncher:
        """Warm when this worker's standby is ready (waited for while it imports) and the job needs no GPU, else
        torchrun; every node launches as node 0 chose (:mod:`worker.gang.plan`)."""
        warm = self.context.warm
        if warm is None or self.context.gpu_lock_fds:
            return GangLauncher.TORCHRUN
        ready = warm.wait_ready(WARM_WAIT_S, self._renew_leases)
        return GangLauncher.WARM if ready is not None else GangLauncher.TORCHRUN

    def _renew_leases(self) -> None:
        self.lease.renew_if_due()
        self.member_lease.renew_if_due()

    def _start_run(self, command: list[str], environment: dict[str, str]) -> RunProcess:
        if self.launcher == GangLauncher.WARM and self.context.warm is not None:
            fds = self.context.gpu_lock_fds
            return self.context.warm.start_run(command, self.run_dir, environment, pass_fds=fds, warm_only=True)
        return start_run(command, self.run_dir, environment, pass_fds=self.context.gpu_lock_fds)

    def _before_launch(self) -> Outcome | None:
        """Wait for the gang; publish the launch file; ``None`` once every node may launch."""
        gathering = Gathering(
            self.members,
            self.claim.job_id,
            self.claim.attempt,
            self.claim.owner,
            self.nodes,
            self.gang_timeout_s,
            self.context.settings.worker_poll_interval_s,
            self.lease.renew_if_due,
            self.member_lease.renew_if_due,
            lambda: self.store.status(self.claim.job_id),
            self.context.shutdown,
        )
        self.launcher = self._choose_launcher()
        write_plan(self.rundir.path, self.resume_from, self.launcher)
        end = gathering.wait()
        log.info("job %s: attempt %d gathering ended: %s", self.claim.job_id, self.claim.attempt, end)
        if end == GangEnd.COMPLETE:
            self.members.mark_running(self.member.id)
            return None
        if end == GangEnd.CANCELLED:
            self.members.release_all(self.claim.job_id, self.claim.attempt)
            return Outcome(JobStatus.CANCELLED, None, "cancelled while its gang gathered")
        if end in (GangEnd.TIMED_OUT, GangEnd.SHUTDOWN) and self._disband(end):
            return Outcome(JobStatus.FAILED, FailureReason.WORKER_SHUTDOWN, f"the gang did not form ({end})")
        return self._lost()

    def _disband(self, end: GangEnd) -> bool:
        """Give the job back to the queue (no attempt counted) and send its message again."""
        if not self.members.disband(self.claim.job_id, self.claim.attempt, self.claim.owner):
            return False
        log.warning(
            "job %s: gang of attempt %d did not form (%s): memberships released, job queued again",
            self.claim.job_id,
            self.claim.attempt,
            end,
        )
        self.lease.mark_lost(f"the gang did not form ({end}): the job is queued again")
        if self.context.enqueue is not None:
            self.context.enqueue(self.claim.job_id)
        return True

    def _peer_outcome(self) -> Outcome | None:
        now = time.monotonic()
        if now < self._next_peer_read:
            return None
        self._next_peer_read = now + PEER_POLL_S
        if not self.member_lease.renew_if_due():
            return self._lost()
        return self._tolerant(
            lambda: peer_verdict(self.members.of_attempt(self.claim.job_id, self.claim.attempt)), None
        )

    def _supervise(self, process: RunProcess) -> Outcome:
        outcome = super()._supervise(process)
        code = process.returncode
        status = MemberStatus.EXITED if code == 0 else MemberStatus.FAILED
        self._tolerant(lambda: self.members.close(self.member.id, status, code), False)
        return self._settle(outcome)

    def _settle(self, outcome: Outcome) -> Outcome:
        """Wait for the other nodes to end; the outcome the whole gang earned."""
        members = self._wait_settled()
        verdict = peer_verdict(members)
        self._tolerant(lambda: self.members.close_expired(self.claim.job_id, self.claim.attempt), 0)
        if outcome.status == JobStatus.SUCCEEDED:
            if all_exited(members, self.nodes):
                return outcome
            return verdict or Outcome(
                JobStatus.FAILED,
                FailureReason.RANK_FAILED,
                "node 0 finished but not every node's torchrun exited 0 in time",
            )
        if verdict is not None and outcome.status == JobStatus.FAILED and outcome.reason in PEER_EXPLAINED:
            return verdict
        return outcome

    def _wait_settled(self) -> list[Member]:
        settings = self.context.settings
        deadline = time.monotonic() + settings.lease_ttl_s + settings.cancel_grace_s
        while True:
            members: list[Member] = self._tolerant(
                lambda: self.members.of_attempt(self.claim.job_id, self.claim.attempt), []
            )
            if (members and settled(members)) or time.monotonic() >= deadline:
                return members
            self.lease.renew_if_due()
            time.sleep(settings.worker_poll_interval_s)

    def _finish(self, outcome: Outcome) -> None:
        super()._finish(outcome)
        if self.process is None:  # never launched: node 0's membership is still open
            closed = MemberStatus.RELEASED if outcome.status != JobStatus.FAILED else MemberStatus.FAILED
            self._tolerant(lambda: self.members.close(self.member.id, closed), False)


def _node_command(spec: JobSpec, spec_path: Path, run_dir: Path, plan: NodePlan) -> list[str]:
    return gang_command(spec, spec_path, run_dir, plan)
