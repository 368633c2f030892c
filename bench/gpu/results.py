"""The JSON summary's contracts: one row per model x precision x path, ratios, DDP, targets."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from bench.gpu.settings import CheckPrecision, ModelKind, PathKind


class RowStatus(StrEnum):
    """``ok``; ``failed`` (a sync, an error, a non-finite loss: the exit failure); ``skipped`` (with a reason)."""

    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Measurement(_Row):
    """What the steady steps of one path measured (one rank)."""

    steady_steps: int
    step_ms: float
    tokens_per_s: float
    flops_per_token: int
    matmul_params: int
    trainable_matmul_params: int
    mfu: float
    sync_check: str
    syncs_per_step: list[int] | None
    last_loss: float
    optimizer: str
    fp8_layers: int | None = None
    skipped_steps: int | None = None


class PathResult(_Row):
    """One model x precision x path (on one rank of ``world_size``)."""

    model: ModelKind
    precision: CheckPrecision
    path: PathKind
    status: RowStatus
    reason: str | None = None
    rank: int = 0
    world_size: int = 1
    measured: Measurement | None = None

    @property
    def tokens_per_s(self) -> float | None:
        """Throughput of an ``ok`` row, else ``None``."""
        return self.measured.tokens_per_s if self.status is RowStatus.OK and self.measured else None


class Comparison(_Row):
    """Halfcast against the hand loop on one model x precision: ``ratio`` = Halfcast / hand tokens/s."""

    model: ModelKind
    precision: CheckPrecision
    halfcast_tokens_per_s: float | None
    hand_tokens_per_s: float | None
    ratio: float | None


class DdpReport(_Row):
    """The checks under DDP (NCCL; gloo on a dry run): per-rank rows and total tokens/s per configuration."""

    status: RowStatus
    reason: str | None = None
    backend: str | None = None
    world_size: int | None = None
    results: list[PathResult] = []
    total_tokens_per_s: dict[str, float] = {}


class Target(_Row):
    """A target from issue 17: ``passed`` is ``None`` when it could not be evaluated (missing or skipped rows)."""

    name: str
    value: float | None
    threshold: float
    passed: bool | None
    note: str


class Summary(_Row):
    """The whole report (written as JSON)."""

    device: str
    gpus: int
    torch: str
    dry_run: bool
    peak_flops: float
    settings: dict[str, object]
    results: list[PathResult]
    comparisons: list[Comparison]
    ddp: DdpReport
    targets: list[Target]
    all_ok: bool
