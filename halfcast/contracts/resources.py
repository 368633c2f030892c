"""The job resource and the pages the job routes answer, as the API serves them and its client reads them.

docs/results.md describes the fields; :mod:`server.schemas` builds these models from the database
rows, the routes answer them, and :class:`halfcast.client.HalfcastClient` returns them. Step and
evaluation records (``latest``, ``eval``, ``points``, ``evals``) and precision switches are the
record models of :mod:`halfcast.contracts.records` as :mod:`halfcast.contracts.stored` serves them: typed, their JSON
the object the worker stored (the fields the trainer wrote, an older trainer's missing ones absent).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from halfcast.contracts.records import DataReport, StartupTimes
from halfcast.contracts.spec import JobSpec
from halfcast.contracts.status import AttemptStatus, JobStatus, MemberStatus
from halfcast.contracts.stored import StoredEval, StoredStep, StoredSwitch

#: How a job's spec scales its loss: fp16's ``loss_scale.mode`` (default ``dynamic``); ``none`` for
#: fp32, bf16 and fp8, whose step records carry ``loss_scale`` 1 (``halfcast.contracts.spec.JobSpec.effective_loss_scale``).
LossScaling = Literal["dynamic", "static", "none"]
#: What a starting job is doing (the resource's ``phase``).
StartupPhase = Literal["launching", "loading data", "building model", "first step"]


class JobError(BaseModel):
    """Why a job failed: a typed ``reason`` (see docs/architecture.md) and a human ``message``."""

    reason: str
    message: str


class AttemptPublic(BaseModel):
    """One launch attempt: who ran it, when, and how it ended (``ended_at``, ``status``, ``reason`` null while it runs)."""

    attempt: int = Field(description="1-based attempt number (the lease's fencing token)")
    worker_id: str = Field(description="The worker that ran it, as <hostname>/<pid>")
    started_at: datetime
    ended_at: datetime | None
    status: AttemptStatus | None = Field(
        description="How it ended: the job's terminal status, or requeued (a graceful worker shutdown stopped it "
        "and queued the job again, not counted against max_attempts; reason worker_shutdown)"
    )
    reason: str | None = Field(description="The typed reason it ended with (e.g. worker_lost, worker_shutdown)")
    gpus: list[int] | None = Field(default=None, description="GPU indices on the worker's host it was given; null: CPU")
    resumed_from_step: int | None = Field(
        default=None,
        description="A retry: the step of the earlier attempts' checkpoint it resumed from (0: none, it started over); "
        "null for a first attempt",
    )


class MemberPublic(BaseModel):
    """One node of a multi-node job's gang in the current attempt (docs/api.md, "Multi-node jobs")."""

    node_rank: int = Field(
        description="The node's place in the gang (0: the node that claimed the job and hosts the rendezvous)"
    )
    worker_id: str = Field(description="The worker running this node, as <hostname>/<pid>")
    host_address: str | None = Field(description="The address the node is reached at by the other nodes")
    status: MemberStatus = Field(
        description="joined, running, exited (its torchrun exited 0), failed, lost or released"
    )
    exit_code: int | None = Field(default=None, description="Its torchrun's exit status once it ended; null before")
    joined_at: datetime
    ended_at: datetime | None = None


class StoppedEarlyPublic(BaseModel):
    """Early stopping ended the job: at ``step``, on ``metric``, whose best evaluation was ``best_value`` at ``best_step``."""

    step: int
    metric: str
    best_step: int | None = None
    best_value: float | None = None


class ThroughputPublic(BaseModel):
    """A succeeded run's headline throughput: its applied steps' samples (tokens) per second of training time."""

    samples_per_second: float
    tokens_per_second: float | None = None


class JobPublic(BaseModel):
    """The job resource (``GET /jobs/{id}``). Timestamps are UTC; ``step`` is the latest attempted step."""

    id: str
    name: str | None
    status: JobStatus
    spec: dict[str, object]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: JobError | None
    step: int
    max_steps: int
    world_size: int
    nodes: int = Field(default=1, description="Hosts the job spans (the spec's nodes)")
    members: list[MemberPublic] = Field(
        default_factory=list,
        description="The nodes of the current attempt's gang, by node rank; empty for one-node jobs",
    )
    latest: StoredStep | None = Field(description="The newest step record, or null")
    eval: StoredEval | None = Field(description="The newest evaluation record, or null")
    attempt: int = Field(description="Launch attempts so far (0 while queued)")
    attempts: list[AttemptPublic] = Field(default_factory=list, description="Every launch attempt, oldest first")
    precision_switches: list[StoredSwitch] = Field(
        default_factory=list,
        description='Precision switches of the run (on_divergence "fallback_bf16"), oldest first: '
        "{step, from, to, reason, message, rewound_to_step, time}",
    )
    effective_precision: str = Field(
        default="fp32", description="The precision the job computes in: the spec's, or the last switch's 'to'"
    )
    loss_scaling: LossScaling = Field(
        default="none",
        description="How the spec's precision scales the loss: fp16's loss_scale.mode (dynamic or static); "
        "none for fp32, bf16 and fp8 (their records' loss_scale is 1). After a switch to bf16 the steps "
        "trained in bf16 are not scaled either (loss_scale 1)",
    )
    applied_steps: int = Field(
        default=0, description="Attempted steps up to `step` that applied an update (`step` minus `skipped_steps`)"
    )
    skipped_steps: int = Field(
        default=0,
        description="Attempted steps up to `step` skipped for non-finite gradients (the latest record's count)",
    )
    stopped_early: StoppedEarlyPublic | None = Field(
        default=None, description="Set when early stopping ended the succeeded job before `max_steps`"
    )
    exported_step: int | None = Field(
        default=None, description="The step whose weights the job's exports hold (the best evaluation with `keep_best`)"
    )
    data: DataReport | None = Field(
        default=None,
        description="A file dataset's report from the job's `start` record: `rows`, `train_examples`, "
        "`held_out_examples` (after drops), `dropped_rows` (no supervised token, per split), `truncated`, "
        "`pad_token` (`source` `eos` when the tokenizer has no pad token); null before it, or for other datasets",
    )
    throughput: ThroughputPublic | None = Field(
        default=None,
        description="Set when the job succeeded: the run's headline throughput, its applied steps' samples (tokens) "
        "per second of training time after the first step, evaluations and checkpoints left out (the step records' "
        "`samples_per_second` are trailing windows of at least 1 s)",
    )
    phase: StartupPhase | None = Field(
        default=None,
        description="While the job starts, what it is doing: `launching` (status `starting`), then, `running` before "
        "its first step, `loading data`, `building model`, `first step`; null otherwise",
    )
    startup: StartupTimes | None = Field(
        default=None,
        description="The current attempt's start-up phase times so far; null before its trainer reported one",
    )

    def job_spec(self) -> JobSpec:
        """``spec`` as the typed :class:`~halfcast.contracts.spec.JobSpec` (its defaults filled in).

        Raises ``pydantic.ValidationError`` for a spec stored by an older Halfcast whose rules have since
        been tightened (the resource still carries it as stored).
        """
        return JobSpec.model_validate(self.spec)


class JobList(BaseModel):
    """A page of jobs, newest first. Pass ``next_cursor`` as ``cursor`` for the next page (null: last page)."""

    jobs: list[JobPublic]
    next_cursor: str | None


class MetricsPage(BaseModel):
    """Step records of one job in step order (``GET /jobs/{id}/metrics``).

    Page on by passing the last point's ``step`` as ``after_step``; an empty or short
    page means no more records yet.
    """

    job_id: str
    points: list[StoredStep]


class EvalList(BaseModel):
    """Every evaluation of one job in step order (``GET /jobs/{id}/evals``): its validation curve.

    Each is ``{"step", "time", "loss", "accuracy"|"perplexity"}``; the job resource's
    ``eval`` is the last of them.
    """

    job_id: str
    evals: list[StoredEval]


class LogLines(BaseModel):
    """The last lines of one rank's log of one attempt (oldest first; no line endings)."""

    job_id: str
    attempt: int = Field(description="The attempt the lines come from (1-based)")
    rank: int = Field(description="The global rank whose stdout and stderr these are")
    lines: list[str] = Field(description="At most `tail` lines; empty while the rank has written nothing")
