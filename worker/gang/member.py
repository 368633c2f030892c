"""A node other than node 0 of a multi-node job: wait for the gang, run its torchrun, end with the attempt.

The member renews its membership (:class:`worker.gang.formation.MemberLease`) from the moment it joined.
It launches once node 0 has moved the job to ``starting`` for its attempt, with the rendezvous
endpoint of node 0's membership and the checkpoint of node 0's launch file
(:mod:`worker.gang.plan`). Its torchrun's output goes to ``<run_dir>/nodes/node-<k>/logs/launcher.log``
(each rank's to the shared ``logs/rank-<r>.log``). It stops its run at once when the job is
cancelling, ended, or no longer this attempt's, when node 0's membership failed or is lost, when
its own membership can no longer be renewed (self-fencing, as a job lease), or when its worker
shuts down; and it records how its torchrun exited in its membership, which node 0 reads.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError

from halfcast.contracts.rundir import RunDir
from halfcast.contracts.spec import JobSpec
from halfcast.contracts.status import JobStatus, MemberStatus
from halfcast.core.db.members import Member, Members
from halfcast.core.db.models import Job, utcnow
from worker.gang.formation import MemberLease
from worker.gang.launch import NodePlan, gang_command, node_environment
from worker.gang.plan import WARM_WAIT_S, GangLauncher, read_plan
from worker.launch.process_tree import RunProcess, build_environment, start_run
from worker.runner import RunnerContext

log = logging.getLogger(__name__)

#: Seconds between two reads of the job and node 0's membership while the run goes on.
WATCH_POLL_S = 0.5
#: Job statuses in which a launched gang keeps running.
RUNNING_STATUSES = frozenset({JobStatus.STARTING, JobStatus.RUNNING})


@dataclass(frozen=True)
class JobState:
    """What a member reads of its job: status, attempt, run directory."""

    status: str
    attempt: int
    run_dir: str | None


class MemberRun:
    """One membership of a node ``k`` > 0, from joined to closed."""

    def __init__(self, member: Member, context: RunnerContext, nodes: int) -> None:
        self.member = member
        self.context = context
        self.members = Members(context.store.engine)
        self.lease = MemberLease(self.members, member.id, context.settings.lease_ttl_s)
        self.nodes = nodes
        self.process: RunProcess | None = None

    def run(self) -> MemberStatus:
        """Run the membership to its end; the status it was closed with."""
        status, code = MemberStatus.FAILED, None
        try:
            launched = self._wait_for_launch()
            if launched is None:
                status = MemberStatus.RELEASED
            else:
                status, code = self._supervise(*launched)
        except Exception:
            log.exception("job %s: node %d: worker error", self.member.job_id, self.member.node_rank)
        finally:
            code = self._stop(code)
            if not self.lease.lost:
                self._close(status, code)
        log.info("job %s: node %d ended: %s (exit %s)", self.member.job_id, self.member.node_rank, status, code)
        return status

    def _job(self) -> JobState | None:
        query = select(Job.status, Job.attempt, Job.run_dir).where(Job.id == self.member.job_id)
        with self.members.engine.connect() as conn:
            row = conn.execute(query).one_or_none()
        return None if row is None else JobState(row.status, row.attempt, row.run_dir)

    def _mine(self, job: JobState | None) -> bool:
        return job is not None and job.attempt == self.member.attempt

    def _wait_for_launch(self) -> tuple[RunProcess, Path] | None:
        poll_s = self.context.settings.worker_poll_interval_s
        while self.lease.renew_if_due() and not self.context.shutdown.is_set():
            job = self._job()
            if not self._mine(job) or job is None or job.status in (JobStatus.CANCELLING, JobStatus.QUEUED):
                return None
            if job.status in RUNNING_STATUSES and job.run_dir is not None:
                return self._launch(Path(job.run_dir))
            if job.status != JobStatus.GATHERING:
                return None
            self.context.shutdown.wait(poll_s)
        return None

    def _launch(self, run_dir: Path) -> tuple[RunProcess, Path] | None:
        node0 = next(
            (m for m in self.members.of_attempt(self.member.job_id, self.member.attempt) if m.node_rank == 0), None
        )
        if (
            node0 is None
            or node0.host_address is None
            or node0.rendezvous_port is None
            or self.member.host_address is None
        ):
            return None
        rundir = RunDir(run_dir)
        try:
            spec = JobSpec.model_validate_json(rundir.spec.read_text())
            plan_file = read_plan(run_dir)
        except (OSError, ValidationError) as exc:
            log.error(
                "job %s: node %d cannot read node 0's launch files: %s", self.member.job_id, self.member.node_rank, exc
            )
            return None
        plan = NodePlan(
            self.member.job_id,
            self.member.attempt,
            self.member.node_rank,
            self.nodes,
            node0.host_address,
            node0.rendezvous_port,
            self.member.host_address,
        )
        command = gang_command(spec, rundir.spec, run_dir, plan)
        if plan_file.resume_from is not None:
            command += ["--resume-from", plan_file.resume_from]
        node_dir = run_dir / "nodes" / f"node-{self.member.node_rank}"
        environment = node_environment(
            build_environment(spec, self.context.settings, gpus=self.context.gpus), self.member.host_address
        )
        if not self.members.mark_running(self.member.id):
            return None
        self.process = self._start(command, node_dir, environment, plan_file.launcher)
        return self.process, run_dir

    def _start(
        self, command: list[str], node_dir: Path, environment: dict[str, str], launcher: GangLauncher
    ) -> RunProcess:
        """Start this node's run as node 0 chose (``OSError`` when it must be warm and cannot be)."""
        fds = self.context.gpu_lock_fds
        if launcher == GangLauncher.TORCHRUN:
            return start_run(command, node_dir, environment, pass_fds=fds)
        warm = self.context.warm
        if warm is None:
            raise OSError(
                "node 0 launches this gang warm, but this worker's warm start is off (HALFCAST_WARM_START=0): "
                "the workers of a gang need the same setting"
            )
        if warm.wait_ready(WARM_WAIT_S, self.lease.renew_if_due) is None:
            raise OSError(
                f"node 0 launches this gang warm, and this worker's standby was not ready in {WARM_WAIT_S:.0f} s"
            )
        return warm.start_run(command, node_dir, environment, pass_fds=fds, warm_only=True)

    def _supervise(self, process: RunProcess, run_dir: Path) -> tuple[MemberStatus, int | None]:
        poll_s = self.context.settings.worker_poll_interval_s
        next_watch = 0.0
        while True:
            code = process.poll()
            if code is not None:
                return (MemberStatus.EXITED if code == 0 else MemberStatus.FAILED), code
            if not self.lease.renew_if_due() or self.context.shutdown.is_set():
                return MemberStatus.FAILED, None
            if time.monotonic() >= next_watch:
                next_watch = time.monotonic() + WATCH_POLL_S
                if (reason := self._watch()) is not None:
                    log.warning("job %s: node %d stops its run: %s", self.member.job_id, self.member.node_rank, reason)
                    return MemberStatus.FAILED, None
            self.context.shutdown.wait(poll_s)

    def _watch(self) -> str | None:
        """Why the run must stop now (the job or node 0), or ``None``; a database error waits for the lease."""
        try:
            job = self._job()
            node0 = next(
                (m for m in self.members.of_attempt(self.member.job_id, self.member.attempt) if m.node_rank == 0), None
            )
        except DBAPIError as exc:
            log.warning("job %s: node %d: database unreachable: %s", self.member.job_id, self.member.node_rank, exc)
            return None
        if not self._mine(job) or job is None or job.status not in RUNNING_STATUSES:
            return f"the job is {job.status if job else 'gone'} (attempt {job.attempt if job else '?'})"
        if node0 is None or node0.status in (MemberStatus.FAILED, MemberStatus.LOST) or node0.expired(utcnow()):
            return "node 0 failed or is lost"
        return None

    def _stop(self, code: int | None) -> int | None:
        process = self.process
        if process is None or not process.members():
            return code if process is None else process.returncode
        if not process.stop(self.context.settings.cancel_grace_s, tick=self.lease.renew_if_due):
            log.error("job %s: node %d: processes survived SIGKILL", self.member.job_id, self.member.node_rank)
        return process.returncode

    def _close(self, status: MemberStatus, code: int | None) -> None:
        if status == MemberStatus.EXITED and code != 0:
            status = MemberStatus.FAILED
        try:
            self.members.close(self.member.id, status, code)
        except DBAPIError:
            log.exception("job %s: node %d: could not close its membership", self.member.job_id, self.member.node_rank)
