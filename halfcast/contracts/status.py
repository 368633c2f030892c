"""Job statuses, attempt statuses and typed failure reasons, each an enum defined once.

The values are the strings the database stores, the API serves and ``error.json`` carries
(docs/results.md, "Statuses" and "Failure reasons"). The members are ``str`` (``StrEnum``), so
a member equals its value and either may be used where a status or a reason is expected.
Which reasons are retried is the worker's policy (:mod:`worker.lifecycle.reasons`), which reasons a
trainer may report the trainer's (:mod:`trainer.errors`).
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    """A job's status: ``queued`` → ``starting`` → ``running`` → a terminal one (or ``cancelling`` → ``cancelled``).

    A multi-node job passes through ``gathering`` between ``queued`` and ``starting`` (docs/worker.md, "Multi-node
    jobs"); a gang that does not form in time goes back to ``queued``.
    """

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: A multi-node job (``nodes`` > 1) whose gang is forming: node 0 has claimed it, the other nodes join.
    GATHERING = "gathering"

    @property
    def terminal(self) -> bool:
        """Whether the job has ended (``succeeded``, ``failed`` or ``cancelled``)."""
        return self in TERMINAL_STATUSES


#: The statuses a job ends in; every job reaches one.
TERMINAL_STATUSES: frozenset[JobStatus] = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
#: The statuses in which a claimed attempt runs (and may still write progress).
LIVE_STATUSES: tuple[JobStatus, ...] = (
    JobStatus.STARTING,
    JobStatus.RUNNING,
    JobStatus.CANCELLING,
    JobStatus.GATHERING,
)


class AttemptStatus(StrEnum):
    """How a launch attempt ended: its job's terminal status, or ``requeued`` (a graceful worker shutdown handed it back)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REQUEUED = "requeued"


class FailureReason(StrEnum):
    """Why a job (or an attempt) failed: the ``error.reason`` of the job resource (docs/results.md)."""

    SPEC_INVALID = "spec_invalid"
    PRECISION_UNSUPPORTED = "precision_unsupported"
    GPU_UNAVAILABLE = "gpu_unavailable"
    DATA_UNAVAILABLE = "data_unavailable"
    MODEL_UNAVAILABLE = "model_unavailable"
    CHECKPOINT_UNAVAILABLE = "checkpoint_unavailable"
    LAUNCH_FAILED = "launch_failed"
    RANK_FAILED = "rank_failed"
    OOM = "oom"
    COLLECTIVE_TIMEOUT = "collective_timeout"
    NONFINITE_LOSS = "nonfinite_loss"
    LOSS_SCALE_COLLAPSED = "loss_scale_collapsed"
    NONFINITE_GRADIENTS = "nonfinite_gradients"
    NO_UPDATE_APPLIED = "no_update_applied"
    EXPORT_FAILED = "export_failed"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    WORKER_LOST = "worker_lost"
    WORKER_SHUTDOWN = "worker_shutdown"
    WORKER_ERROR = "worker_error"
    ENQUEUE_FAILED = "enqueue_failed"


class MemberStatus(StrEnum):
    """Where one node of a multi-node job's gang stands (``job_members.status``; the resource's ``members``).

    ``joined``: in the gang, its torchrun not started yet; ``running``: its torchrun runs; ``exited``:
    its torchrun exited 0; ``failed``: it exited otherwise or was stopped; ``lost``: its worker stopped
    renewing the membership; ``released``: it left before launch (the gang timed out, was cancelled, or
    its worker shut down).
    """

    JOINED = "joined"
    RUNNING = "running"
    EXITED = "exited"
    FAILED = "failed"
    LOST = "lost"
    RELEASED = "released"

    @property
    def open(self) -> bool:
        """Whether the membership still holds its worker (``joined`` or ``running``)."""
        return self in OPEN_MEMBER_STATUSES


#: The statuses of a membership that still holds its worker (one such membership per worker).
OPEN_MEMBER_STATUSES: frozenset[MemberStatus] = frozenset({MemberStatus.JOINED, MemberStatus.RUNNING})
