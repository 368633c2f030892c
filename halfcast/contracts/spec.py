"""The job spec: the one contract shared by server, worker and trainer (docs/job-spec.md).

Pure pydantic, torch-free, so the API validates a spec without importing torch.
Every block rejects unknown fields; every value is bounded, so a bad spec is a
``pydantic.ValidationError`` whose ``loc`` names the field (HTTP 422 in the API).
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from halfcast.contracts.catalog import MODEL_DATASETS, TASK_METRICS, DatasetSpec, ModelSpec, dataset_task, field_error
from halfcast.contracts.scale_bounds import float32_bounds

Precision = Literal["fp32", "bf16", "fp16", "fp8"]
#: Largest allowed loss scale; the scale is held in float32, so any finite bound works,
#: and this one keeps a scaled loss of 1.0 far from float32's overflow.
MAX_LOSS_SCALE = 2.0**64
#: Smallest allowed ``min_scale``: far above float32's subnormal range.
MIN_LOSS_SCALE = 2.0**-24
#: Longest allowed ``max_runtime_s``: 30 days.
MAX_RUNTIME_S = 30 * 24 * 3600.0
#: Most optimizer steps a job may attempt; also bounds every step number and interval.
MAX_STEPS = 100_000_000
#: Largest allowed ``max_grad_norm`` (clipping beyond it never triggers on finite gradients worth training).
MAX_GRAD_NORM = 1e9
#: Most ranks a job may have over all its nodes (``gpus`` <= 1024, ``processes`` <= 256 per node); bounds rank numbers.
MAX_RANKS = 1024
#: Most hosts (nodes) one job may span.
MAX_NODES = 64
#: Longest ``distributed.timeout_s`` and ``distributed.gang_timeout_s``: one day.
MAX_DISTRIBUTED_TIMEOUT_S = 24 * 3600.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LossScaleSpec(_Strict):
    """fp16 loss scaling.

    ``dynamic``: the scale starts at ``init_scale``; after ``hysteresis`` overflows
    (non-finite gradients) it is multiplied by ``backoff_factor``; after
    ``growth_interval`` consecutive clean steps by ``growth_factor`` (which also refills
    the hysteresis; with ``consecutive_hysteresis`` every clean step refills it); always
    clamped to ``[min_scale, max_scale]`` (the scale is float32: the bounds are rounded
    inward to float32, and bounds that bracket no float32 are rejected). ``static``:
    ``static_scale`` (default ``init_scale``) is used on every step, as given (the
    bounds belong to the dynamic rule); overflowing steps are still skipped.
    """

    mode: Literal["dynamic", "static"] = "dynamic"
    init_scale: Annotated[float, Field(gt=0.0, le=MAX_LOSS_SCALE, allow_inf_nan=False)] = 65536.0
    growth_factor: Annotated[float, Field(gt=1.0, le=1024.0, allow_inf_nan=False)] = 2.0
    backoff_factor: Annotated[float, Field(gt=0.0, lt=1.0, allow_inf_nan=False)] = 0.5
    growth_interval: Annotated[int, Field(ge=1, le=10_000_000)] = 2000
    hysteresis: Annotated[int, Field(ge=1, le=1_000_000)] = 1
    min_scale: Annotated[float, Field(ge=MIN_LOSS_SCALE, le=MAX_LOSS_SCALE, allow_inf_nan=False)] = 1.0
    max_scale: Annotated[float, Field(gt=0.0, le=MAX_LOSS_SCALE, allow_inf_nan=False)] = 2.0**24
    static_scale: Annotated[float, Field(gt=0.0, le=MAX_LOSS_SCALE, allow_inf_nan=False)] | None = None
    consecutive_hysteresis: bool = False
    #: Measure the fraction of fp16 gradient values that are zero or subnormal every
    #: this many steps (``underflow_fraction`` in step records); null turns it off.
    underflow_sample_interval: Annotated[int, Field(ge=1, le=10_000_000)] | None = 100

    @model_validator(mode="after")
    def _check_bounds(self) -> Self:
        if self.min_scale > self.max_scale:
            msg = f"min_scale ({self.min_scale}) must not exceed max_scale ({self.max_scale})"
            raise field_error("LossScaleSpec", "min_scale", msg, self.min_scale)
        try:
            float32_bounds(self.min_scale, self.max_scale)
        except ValueError as exc:
            raise field_error("LossScaleSpec", "max_scale", str(exc), self.max_scale) from None
        if self.mode == "dynamic" and not self.min_scale <= self.init_scale <= self.max_scale:
            msg = (
                f"init_scale ({self.init_scale}) must lie in [min_scale, max_scale] = "
                f"[{self.min_scale}, {self.max_scale}]"
            )
            raise field_error("LossScaleSpec", "init_scale", msg, self.init_scale)
        if self.mode == "dynamic" and self.static_scale is not None:
            msg = "static_scale is only allowed with mode 'static'"
            raise field_error("LossScaleSpec", "static_scale", msg, self.static_scale)
        return self

    @property
    def effective_static_scale(self) -> float:
        """The scale a static scaler uses: ``static_scale`` or else ``init_scale``."""
        return self.static_scale if self.static_scale is not None else self.init_scale


class OptimizerSpec(_Strict):
    """Optimizer; ``implementation`` picks PyTorch's plain, foreach or fused kernels."""

    name: Literal["adamw", "sgd"] = "adamw"
    lr: Annotated[float, Field(gt=0.0, le=100.0, allow_inf_nan=False)] = 1e-3
    weight_decay: Annotated[float, Field(ge=0.0, le=10.0, allow_inf_nan=False)] = 0.0
    betas: tuple[Annotated[float, Field(ge=0.0, lt=1.0)], Annotated[float, Field(ge=0.0, lt=1.0)]] = (0.9, 0.999)
    eps: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] = 1e-8
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    implementation: Literal["auto", "plain", "foreach", "fused"] = "auto"


class LRSchedulerSpec(_Strict):
    """Learning-rate schedule over *applied* optimizer steps (a skipped step never advances it).

    ``constant``, ``cosine`` and ``linear`` decay to ``min_lr_ratio * lr`` at
    ``max_steps`` after ``warmup_steps`` of linear warm-up; ``step`` multiplies the
    learning rate by ``gamma`` every ``step_size`` applied steps.
    """

    name: Literal["constant", "cosine", "linear", "step"] = "constant"
    warmup_steps: Annotated[int, Field(ge=0, le=10_000_000)] = 0
    min_lr_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    step_size: Annotated[int, Field(ge=1, le=10_000_000)] = 1
    gamma: Annotated[float, Field(gt=0.0, le=1.0)] = 0.1


class KillAtStep(_Strict):
    step: Annotated[int, Field(ge=1, le=MAX_STEPS)]
    rank: Annotated[int, Field(ge=0, lt=MAX_RANKS)] = 0
    signal: Literal["SIGKILL", "SIGTERM", "SIGSEGV", "SIGABRT"] = "SIGKILL"


class FaultsSpec(_Strict):
    """Test-only fault injection; the API accepts it only with ``HALFCAST_ALLOW_FAULTS=1``.

    ``nonfinite_grad_precisions`` limits ``nonfinite_grad_steps`` to runs computing in
    those precisions (default: any), e.g. ``["fp16"]`` simulates fp16 overflows that a
    bf16 fallback (``on_divergence: "fallback_bf16"``) no longer has.
    """

    nonfinite_grad_steps: Annotated[list[Annotated[int, Field(ge=1, le=MAX_STEPS)]], Field(max_length=100_000)] = []
    #: Every step from this one on also gets the non-finite gradient (field case C11: "NaN on every step").
    nonfinite_grad_from_step: Annotated[int, Field(ge=1, le=MAX_STEPS)] | None = None
    nonfinite_value: Literal["inf", "nan"] = "inf"
    ranks: Annotated[list[Annotated[int, Field(ge=0, lt=MAX_RANKS)]], Field(max_length=MAX_RANKS)] | None = None
    sleep_per_step_s: Annotated[float, Field(ge=0.0, le=3600.0)] = 0.0
    kill_at_step: KillAtStep | None = None
    raise_at_step: Annotated[int, Field(ge=1, le=MAX_STEPS)] | None = None
    nonfinite_grad_precisions: Annotated[list[Precision], Field(max_length=4)] | None = None


class DistributedSpec(_Strict):
    """How long distributed waits may last (docs/job-spec.md, "Multi-node jobs").

    ``timeout_s``: the process group's timeout (a collective that waits longer for a peer fails
    the rank); with the workers' lease it bounds how long any node's failure takes to end the
    attempt on every node. ``gang_timeout_s`` (``nodes`` > 1 only): how long a partial gang may
    wait for its other nodes before it releases every membership and the job goes back to ``queued``.
    """

    timeout_s: Annotated[float, Field(ge=1.0, le=MAX_DISTRIBUTED_TIMEOUT_S, allow_inf_nan=False)] = 300.0
    gang_timeout_s: Annotated[float, Field(ge=1.0, le=MAX_DISTRIBUTED_TIMEOUT_S, allow_inf_nan=False)] = 600.0


EvalMetric = Literal["loss", "perplexity", "accuracy"]
#: Metrics that improve downwards; the others (``accuracy``) improve upwards.
LOWER_IS_BETTER: frozenset[str] = frozenset({"loss", "perplexity"})


class EarlyStoppingSpec(_Strict):
    """Stop a job early (it ends ``succeeded``) once its evaluations stop improving.

    ``metric``: a field of the eval record (``loss`` for every task, ``perplexity`` for causal
    LM, ``accuracy`` for classification); ``min`` is better for loss and perplexity, ``max``
    for accuracy (:attr:`mode`). An evaluation improves when it beats the best so far by more
    than ``min_delta``; after ``patience`` evaluations in a row without improvement the job stops
    at that evaluation's step (:mod:`trainer.run.early_stopping`).
    """

    metric: EvalMetric = "loss"
    patience: Annotated[int, Field(ge=1, le=10_000)] = 3
    min_delta: Annotated[float, Field(ge=0.0, le=1e6, allow_inf_nan=False)] = 0.0

    @property
    def mode(self) -> Literal["min", "max"]:
        """``min`` for loss and perplexity, ``max`` for accuracy."""
        return "min" if self.metric in LOWER_IS_BETTER else "max"


ModuleName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.]+$")]


class AdapterSpec(_Strict):
    """A LoRA adapter (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") over an ``hf`` model.

    Only the adapter weights train (and, for ``sequence_classification``, the classification
    head); they are float32 master weights. ``target_modules``: module names (a name matches
    every module whose path ends with it, e.g. ``q_proj``) or ``"all-linear"`` (every Linear but
    the output head); an entry that matches no module fails the job (``spec_invalid``).
    ``base_dtype``: the frozen base weights in float32 (``fp32``) or in the precision's compute
    dtype (``compute``, halving their memory for bf16/fp16; the same as ``fp32`` for fp32);
    default ``compute`` for bf16 and fp16, else ``fp32``.
    """

    type: Literal["lora"] = "lora"
    r: Annotated[int, Field(ge=1, le=4096)] = 8
    alpha: Annotated[float, Field(gt=0.0, le=65536.0, allow_inf_nan=False)] = 16.0
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    target_modules: Annotated[list[ModuleName], Field(min_length=1, max_length=64)] | Literal["all-linear"] = (
        "all-linear"
    )
    base_dtype: Literal["fp32", "compute"] | None = None


class ExportSpec(_Strict):
    """What an ``hf`` job's ``export/model`` is written in.

    ``dtype``: the merged model's floating-point weights in ``fp32``, ``bf16`` or ``fp16``;
    default (null): the base's stored dtype (the widest floating dtype of its weight files;
    float32 for a base initialised from ``hf_config``), so every weight the job did not train is
    bit-identical to the base on disk. The trained delta is always merged in float32 first.
    """

    dtype: Literal["fp32", "bf16", "fp16"] | None = None


class JobSpec(_Strict):
    """A training job. See docs/job-spec.md for the meaning of each field.

    The fields are declared in the groups of docs/job-spec.md's "Fields" (tests/test_examples.py
    holds the two to the same order); the JSON shape stays flat, so stored specs need no migration.

    Raises ``pydantic.ValidationError`` (``loc`` names the field) for unknown fields,
    out-of-range values, a ``loss_scale`` block on a non-fp16 job, fp8 without GPUs,
    a model that cannot consume the dataset, or a ``global_batch_size`` that
    ``micro_batch_size * world_size`` does not divide.

    ``resume_from`` names a job of the submitting owner (its newest checkpoint), or a
    checkpoint file in that job's run directory as ``<job id>/attempt-<n>/checkpoints/<file>``
    (never an absolute path; another owner's job is a 422 as for a missing one); the job
    continues from there exactly (same losses, loss scales and skips as an uninterrupted run).
    Only ``max_steps``, intervals, limits, ``name`` and ``faults`` may differ from the checkpointed spec.

    ``fp8_recipe`` (fp8 only; ``None`` means ``tensorwise``, so a stored spec round-trips
    through ``model_dump``) picks torchao's float8 scaling recipe: ``tensorwise`` or
    ``rowwise``. ``parallelism`` is ``ddp`` (replicated parameters) or ``fsdp`` (FSDP2
    ``fully_shard``: fp32 master weights sharded over ranks, compute in the precision's
    dtype, gradients reduced in fp32).

    ``log_interval``: step records are gathered on the device and copied to the host
    (and written, one record per attempted step) every ``log_interval`` steps, after the
    process's first step (it ends the start-up, :mod:`trainer.startup`), before each
    evaluation and checkpoint, and at the end; the divergence guard checks them
    then, so a job fails at most ``log_interval - 1`` steps after a limit is reached.
    ``log_interval_s``: rank 0 also writes the pending records once the oldest is this
    many seconds old (slow steps still stream promptly; ``null``: steps only).

    Divergence guard: a job fails with reason ``nonfinite_gradients`` after
    ``max_consecutive_skips`` consecutive skipped steps, and with ``nonfinite_loss``
    after ``max_consecutive_nonfinite_losses`` consecutive non-finite losses, and with
    ``loss_scale_collapsed`` instead of ``nonfinite_gradients`` when the dynamic scale
    sat at ``min_scale`` and the skipped steps had only infinities (no NaN).
    ``on_divergence`` (fp16 only for ``fallback_bf16``): ``fail`` (default) fails the job
    then; ``fallback_bf16`` instead rewinds once to the last healthy checkpoint (or step
    0) and continues in bf16 without loss scaling (:mod:`trainer.run.fallback`); a guard
    failure in bf16 then fails the job as usual.

    ``nodes``: hosts the job spans (default 1), each running ``gpus`` (or ``processes``) ranks;
    ``distributed``: the process group's and the gang's timeouts (:class:`DistributedSpec`).
    ``compile`` (default false): ``torch.compile`` of the model, compiled before the first step
    (:mod:`trainer.model_compile`; the ``start`` record's ``compile_s``); not with ``parallelism:
    fsdp`` or ``precision: fp8`` (a 422 naming ``compile``).

    Job-server limits (read by the worker, not the trainer): ``max_attempts`` launches
    at most (a lost worker's job is retried from its last checkpoint until then), and
    ``max_runtime_s`` seconds of running time over all attempts (then ``deadline_exceeded``).
    """

    # -- The job
    name: Annotated[str, Field(max_length=200)] | None = None
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 3
    max_runtime_s: Annotated[float, Field(gt=0.0, le=MAX_RUNTIME_S, allow_inf_nan=False)] | None = None

    # -- What trains
    model: ModelSpec
    dataset: DatasetSpec
    adapter: AdapterSpec | None = None
    export: ExportSpec | None = None

    # -- Precision and the divergence guard
    precision: Precision = "fp32"
    fp8_recipe: Literal["tensorwise", "rowwise"] | None = None
    loss_scale: LossScaleSpec | None = None
    max_consecutive_skips: Annotated[int, Field(ge=1, le=1_000_000)] = 50
    max_consecutive_nonfinite_losses: Annotated[int, Field(ge=1, le=1_000_000)] = 10
    on_divergence: Literal["fail", "fallback_bf16"] = "fail"

    # -- Batch
    micro_batch_size: Annotated[int, Field(ge=1, le=1_000_000)] = 32
    gradient_accumulation_steps: Annotated[int, Field(ge=1, le=65536)] | None = None
    global_batch_size: Annotated[int, Field(ge=1, le=1 << 30)] | None = None

    # -- Ranks and parallelism
    gpus: Annotated[int, Field(ge=0, le=1024)] = 0
    processes: Annotated[int, Field(ge=1, le=256)] = 1
    nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] = 1
    distributed: DistributedSpec | None = None
    parallelism: Literal["ddp", "fsdp"] = "ddp"
    compile: bool = False

    # -- Optimization
    max_steps: Annotated[int, Field(ge=1, le=MAX_STEPS)] = 100
    optimizer: OptimizerSpec = OptimizerSpec()
    lr_scheduler: LRSchedulerSpec = LRSchedulerSpec()
    max_grad_norm: Annotated[float, Field(gt=0.0, le=MAX_GRAD_NORM, allow_inf_nan=False)] | None = None
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0

    # -- Evaluation and checkpoints
    eval_interval: Annotated[int, Field(ge=1, le=MAX_STEPS)] | None = None
    early_stopping: EarlyStoppingSpec | None = None
    keep_best: bool = False
    checkpoint_interval: Annotated[int, Field(ge=1, le=MAX_STEPS)] | None = None
    resume_from: Annotated[str, Field(min_length=1, max_length=1024)] | None = None

    # -- Step records
    log_interval: Annotated[int, Field(ge=1, le=10_000)] = 10
    log_interval_s: Annotated[float, Field(gt=0.0, le=3600.0, allow_inf_nan=False)] | None = 0.1

    # -- Test-only
    faults: FaultsSpec | None = None

    @field_validator("name", "resume_from")
    @classmethod
    def _printable(cls, value: str | None, info: ValidationInfo) -> str | None:
        """No control characters, NUL or lone surrogates: they cannot be stored, rendered or used as paths."""
        if value is not None and not value.isprintable():
            raise ValueError(f"{info.field_name} must be printable text")
        return value

    @field_validator("resume_from")
    @classmethod
    def _job_reference(cls, value: str | None) -> str | None:
        """``<job id>`` or ``<job id>/<path in its run directory>``: never absolute, never climbing out with ``..``."""
        if value is None:
            return value
        parts = value.split("/")
        if "\\" in value or any(part in ("", ".", "..") for part in parts):
            msg = (
                "resume_from must be a job id or '<job id>/<path in its run directory>' "
                "(e.g. '<job id>/attempt-1/checkpoints/final.pt'): no absolute path, no '.', '..' or empty part"
            )
            raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _check_consistency(self) -> Self:
        if self.dataset.name not in MODEL_DATASETS[self.model.name]:
            allowed = ", ".join(sorted(MODEL_DATASETS[self.model.name]))
            msg = f"model '{self.model.name}' cannot train on dataset '{self.dataset.name}' (it takes: {allowed})"
            raise field_error("JobSpec", "dataset", msg, self.dataset.name)
        self._check_hf()
        self._check_evaluation()
        if self.loss_scale is not None and self.precision != "fp16":
            msg = f"only fp16 uses loss scaling; precision is '{self.precision}'"
            raise field_error("JobSpec", "loss_scale", msg, self.loss_scale.model_dump())
        if self.on_divergence == "fallback_bf16" and self.precision != "fp16":
            msg = f"on_divergence 'fallback_bf16' is only meaningful with precision 'fp16'; precision is '{self.precision}'"
            raise field_error("JobSpec", "on_divergence", msg, self.on_divergence)
        if self.fp8_recipe is not None and self.precision != "fp8":
            msg = f"fp8_recipe is only meaningful with precision 'fp8'; precision is '{self.precision}'"
            raise field_error("JobSpec", "fp8_recipe", msg, self.fp8_recipe)
        if self.parallelism == "fsdp" and self.optimizer.name == "sgd" and self.optimizer.implementation == "fused":
            msg = "fused SGD cannot step FSDP2's sharded parameters (PyTorch has no DTensor rule for it); use foreach or auto"
            raise field_error("JobSpec", "optimizer", msg, self.optimizer.model_dump())
        if self.precision == "fp8" and self.gpus == 0:
            msg = "fp8 needs a CUDA GPU with compute capability >= 8.9, and gpus is 0"
            raise field_error("JobSpec", "precision", msg, self.precision)
        if self.gpus > 0 and self.processes not in (1, self.gpus):
            msg = "with GPUs there is one rank per GPU; leave processes at 1"
            raise field_error("JobSpec", "processes", msg, self.processes)
        self._check_nodes()
        self._check_batch()
        self._check_compile()
        return self

    def _check_nodes(self) -> None:
        """At most ``MAX_RANKS`` ranks over all nodes; a gang timeout only for a gang (``nodes`` > 1)."""
        if self.world_size > MAX_RANKS:
            msg = f"{self.nodes} nodes x {self.ranks_per_node} ranks per node = {self.world_size} ranks; at most {MAX_RANKS}"
            raise field_error("JobSpec", "nodes", msg, self.nodes)
        if self.nodes == 1 and self.distributed is not None and "gang_timeout_s" in self.distributed.model_fields_set:
            msg = "gang_timeout_s is only meaningful with nodes > 1 (a one-node job forms no gang)"
            raise field_error("JobSpec", ("distributed", "gang_timeout_s"), msg, self.distributed.gang_timeout_s)

    def _check_compile(self) -> None:
        """``compile: true`` where Halfcast compiles: not FSDP2's sharded model, not fp8's Linears."""
        if not self.compile:
            return
        if self.parallelism == "fsdp":
            raise field_error("JobSpec", "compile", "compile is not supported with parallelism 'fsdp'", self.compile)
        if self.precision == "fp8":
            msg = "compile is not supported with precision 'fp8' (its Linears record overflows on the host)"
            raise field_error("JobSpec", "compile", msg, self.compile)

    def _check_hf(self) -> None:
        """Adapters need an ``hf`` model; byte-level ``text`` is causal LM without a tokenizer."""
        if self.model.name != "hf":
            if self.adapter is not None:
                msg = f"adapters fine-tune 'hf' models only; model is '{self.model.name}'"
                raise field_error("JobSpec", "adapter", msg, self.adapter.model_dump())
            if self.export is not None:
                msg = f"only 'hf' models are exported; model is '{self.model.name}'"
                raise field_error("JobSpec", "export", msg, self.export.model_dump())
            return
        config = self.model.config
        if self.dataset.name == "text" and (config.task != "causal_lm" or config.tokenizer_path is not None):
            msg = (
                "dataset 'text' is byte-level causal language modelling: use task 'causal_lm' without a tokenizer_path"
            )
            raise field_error("JobSpec", "dataset", msg, self.dataset.name)

    def _check_evaluation(self) -> None:
        """``early_stopping`` and ``keep_best`` need ``eval_interval``; the metric must be one the task reports."""
        for field, value in (("early_stopping", self.early_stopping), ("keep_best", self.keep_best or None)):
            if value is not None and self.eval_interval is None:
                msg = f"{field} needs eval_interval (it acts on the periodic evaluations)"
                raise field_error("JobSpec", field, msg, value if isinstance(value, bool) else value.model_dump())
        if self.early_stopping is None:
            return
        task, metric = dataset_task(self.dataset), self.early_stopping.metric
        if task is None:  # a registered dataset's format: checked once resolved (halfcast.core.registry.refs)
            return
        if metric not in TASK_METRICS[task]:
            allowed = ", ".join(sorted(TASK_METRICS[task]))
            msg = f"metric '{metric}' is not reported for {task} data (its evaluations report: {allowed})"
            raise field_error("JobSpec", ("early_stopping", "metric"), msg, metric)

    def _check_batch(self) -> None:
        per_step = self.micro_batch_size * self.world_size
        if self.global_batch_size is None:
            return
        if self.global_batch_size % per_step:
            msg = (
                f"{self.global_batch_size} is not divisible by micro_batch_size x world_size = "
                f"{self.micro_batch_size} x {self.world_size} = {per_step}"
            )
            raise field_error("JobSpec", "global_batch_size", msg, self.global_batch_size)
        derived = self.global_batch_size // per_step
        if self.gradient_accumulation_steps not in (None, derived):
            msg = (
                f"{self.gradient_accumulation_steps} contradicts global_batch_size "
                f"{self.global_batch_size} = {self.micro_batch_size} x {derived} x {self.world_size}"
            )
            raise field_error("JobSpec", "gradient_accumulation_steps", msg, self.gradient_accumulation_steps)

    # ------------------------------------------------------------------ derived values

    @property
    def best_metric(self) -> EvalMetric:
        """The metric ``keep_best`` ranks evaluations by: early stopping's, else ``loss``."""
        return self.early_stopping.metric if self.early_stopping is not None else "loss"

    @property
    def ranks_per_node(self) -> int:
        """Ranks on each node: one per GPU, or ``processes`` on CPU (torchrun's ``--nproc-per-node``)."""
        return self.gpus if self.gpus > 0 else self.processes

    @property
    def world_size(self) -> int:
        """Number of ranks over all nodes: ``nodes`` x :attr:`ranks_per_node`."""
        return self.nodes * self.ranks_per_node

    @property
    def total_gpus(self) -> int:
        """GPUs the job holds over all its nodes: ``nodes`` x ``gpus`` (what GPU quotas count)."""
        return self.nodes * self.gpus

    @property
    def effective_distributed(self) -> DistributedSpec:
        """The distributed timeouts: the given block, else the defaults."""
        return self.distributed or DistributedSpec()

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step (given, or derived from ``global_batch_size``)."""
        if self.global_batch_size is not None:
            return self.global_batch_size // (self.micro_batch_size * self.world_size)
        return self.gradient_accumulation_steps or 1

    @property
    def effective_global_batch_size(self) -> int:
        """Samples per optimizer step over all ranks: micro-batch x accumulation x world size."""
        return self.micro_batch_size * self.accumulation_steps * self.world_size

    @property
    def effective_fp8_recipe(self) -> Literal["tensorwise", "rowwise"] | None:
        """The fp8 scaling recipe: the given one, ``tensorwise`` by default for fp8, else ``None``."""
        if self.precision != "fp8":
            return None
        return self.fp8_recipe or "tensorwise"

    @property
    def effective_base_dtype(self) -> Literal["fp32", "compute"] | None:
        """Where an adapter job keeps its frozen base weights: the given ``base_dtype``, ``compute`` by
        default for bf16/fp16/fp8 (fp8's compute dtype is bf16), ``fp32`` for fp32 (``compute`` with fp32
        is fp32); ``None`` without an adapter."""
        if self.adapter is None:
            return None
        if self.precision == "fp32":
            return "fp32"
        return self.adapter.base_dtype or "compute"

    @property
    def effective_loss_scale(self) -> LossScaleSpec | None:
        """The loss-scale policy: the given block, the fp16 defaults (docs/job-spec.md), else ``None``."""
        if self.precision != "fp16":
            return None
        return self.loss_scale or LossScaleSpec()
