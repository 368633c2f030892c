"""The lines of ``records.jsonl``: what trainer rank 0 writes, the worker reads and the API serves.

Each line is one JSON object whose ``type`` names its record (docs/architecture.md, "The run
directory"): :class:`PhaseRecord`, :class:`StartRecord`, :class:`StepRecord`, :class:`EvalRecord`,
:class:`PrecisionSwitchRecord` and :class:`EndRecord`. :data:`Record` is their union,
discriminated by ``type``; :func:`parse_record` reads one line's object into it.

Known fields are typed; unknown ones are allowed and kept (``extra="allow"``), so the lines of
an older or a newer trainer still read, and a field the reader does not know travels on into
the database. Only what every reader relies on is required (a step record's ``step``, an
``end`` record's counts...); the rest is optional, because older trainers did not write it.
:meth:`RecordBase.line` is the JSON object of the line: strict JSON, a non-finite float becomes
``null``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

log = logging.getLogger(__name__)

#: A step number or a step count (never a bool, a float or a string).
Step = Annotated[int, Field(strict=True)]
#: A count of steps, at least 0.
Count = Annotated[int, Field(ge=0, strict=True)]
#: Seconds a start-up phase took.
Seconds = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
#: The start-up phase a ``phase`` record says begins; ``training``: start-up is over.
PhaseName = Literal["data", "model", "first_step", "training"]

_OPEN = ConfigDict(extra="allow", frozen=True, populate_by_name=True)
_CLOSED = ConfigDict(extra="ignore", frozen=True)


def finite(value: Any) -> Any:
    """``value`` with every non-finite float, however deeply nested, replaced by ``None`` (JSON has none)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite(item) for item in value]
    return value


class RecordBase(BaseModel):
    """What every record has: ``time``, unix seconds (a step record's: when the step was issued)."""

    model_config = _OPEN

    type: str
    time: float | None = None

    def body(self) -> dict[str, object]:
        """The fields the record was given, without ``type``, as JSON data (non-finite floats as ``None``)."""
        body: dict[str, object] = finite(
            self.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude={"type"})
        )
        return body

    def line(self) -> dict[str, object]:
        """The JSON object of the record's line: ``type`` first, then :meth:`body`."""
        return {"type": self.type, **self.body()}


class StartupTimes(BaseModel):
    """Seconds each start-up phase took; ``None`` until it ended (or when the trainer could not time it).

    The one definition: the trainer's clock keeps it (:mod:`trainer.startup`), ``phase`` and ``start``
    records carry it, and the job resource serves the current attempt's as ``startup`` (docs/api.md, "Start-up").
    """

    model_config = _CLOSED

    launch_s: Seconds | None = Field(
        default=None, description="From the worker starting torchrun to the trainer's Python"
    )
    imports_s: Seconds | None = Field(
        default=None, description="Then to the training loop (imports, spec, process group)"
    )
    data_s: Seconds | None = Field(
        default=None, description="Then to the dataset built (a resumed run's checkpoint read)"
    )
    model_s: Seconds | None = Field(default=None, description="Then to the model, optimizer and schedule built")
    first_step_s: Seconds | None = Field(default=None, description="Then to the first step's record written")

    def as_record(self) -> dict[str, float | None]:
        """The times as a record's ``startup`` field (every key, ``None`` included)."""
        return self.model_dump()


class PhaseRecord(RecordBase):
    """A start-up phase begins (``data``, ``model``, ``first_step``; ``training`` once the first step's record is written)."""

    type: Literal["phase"] = "phase"
    phase: PhaseName
    startup: StartupTimes = StartupTimes()


class PrecisionSwitch(BaseModel):
    """One switch from fp16 to bf16 (``on_divergence: "fallback_bf16"``): the one model of it, whoever holds it.

    The trainer decides it (:mod:`trainer.run.fallback`) and keeps it in its checkpoints (:meth:`body`), a
    ``start`` record repeats it, its own line is a :class:`PrecisionSwitchRecord`, and the API serves it
    (:class:`~halfcast.contracts.stored.StoredSwitch`). ``step``: where the divergence guard tripped;
    ``from``/``to``: the precisions; ``reason`` the divergence's typed reason and ``message`` its text;
    ``rewound_to_step``: the checkpoint step training went on from (0: the start); ``time``: unix seconds.
    """

    model_config = _OPEN

    step: Step | None = None
    from_: str | None = Field(default=None, alias="from")
    to: str | None = None
    reason: str | None = None
    message: str | None = None
    rewound_to_step: Count
    time: float | None = None

    def body(self) -> dict[str, object]:
        """The fields the switch was given, as JSON data (``from`` by its name)."""
        body: dict[str, object] = finite(self.model_dump(mode="json", by_alias=True, exclude_unset=True))
        return body


class PadToken(BaseModel):
    """What batches are padded with: ``source`` ``pad`` (the tokenizer's own) or ``eos`` (it has none)."""

    model_config = _OPEN

    id: int | None = None
    token: str | None = None
    source: str | None = None


#: Held-out examples below which evaluation metrics are noise: the trainer logs a warning, status and the job
#: page say so (docs/trainer.md).
HELD_OUT_MINIMUM = 10


class DataReport(BaseModel):
    """A file dataset's report in the ``start`` record's ``data``: what the job read and chose (docs/trainer.md).

    ``dropped_rows``: rows dropped for having no supervised token, per split (``train``, ``held_out``);
    ``held_out_examples``: the held-out size after drops; ``pad_token``: what batches are padded with.
    """

    model_config = _OPEN

    format: str | None = None
    rows: int | None = None
    train_examples: int | None = None
    held_out_examples: int | None = None
    truncated: int | None = None
    dropped_rows: dict[str, int] | None = None
    trainable_tokens: int | None = None
    label_names: list[str] | None = None
    pad_token: PadToken | None = None


class StartRecord(RecordBase):
    """The run's set-up, written once its model and data are built (before the first step)."""

    type: Literal["start"] = "start"
    world_size: Step | None = None
    device: str | None = None
    precision: str | None = None
    compute_dtype: str | None = None
    accumulation_steps: int | None = None
    micro_batch_size: int | None = None
    global_batch_size: int | None = None
    max_steps: int | None = None
    log_interval: int | None = None
    task: str | None = None
    num_parameters: int | None = None
    #: The model's summary (the trainer's ``{class, parameters, trainable_parameters, parameter_bytes_by_dtype}``), JSON.
    model: dict[str, object] | None = None
    parallelism: str | None = None
    #: Where a resumed run started (0: from scratch).
    resumed_from_step: int | None = None
    startup: StartupTimes | None = None
    #: A run resumed from a checkpoint written after a switch repeats the switch here.
    precision_switch: PrecisionSwitch | None = None
    #: Seconds ``torch.compile`` took before the first step (``compile: true`` jobs only).
    compile_s: Seconds | None = None
    #: A file dataset's report (``jsonl``): rows, splits, drops, pad token.
    data: DataReport | None = None


class StepRecord(RecordBase):
    """One attempted optimizer step (docs/results.md, "Step records").

    ``step``: 1-based attempted step; ``loss``: global mean loss of the window; ``loss_scale``: scale
    used for this step (1.0 without scaling); ``overflow``: non-finite gradients were found and the
    update skipped; ``skipped_steps``: cumulative; ``grad_norm``: pre-clip L2 norm of the unscaled
    gradients (None when skipped); ``lr``: learning rate of this step; throughput in samples (tokens)
    per second over all ranks, over the logging interval the step belongs to (``tokens_per_second``
    None for non-token data); ``samples_total``/``tokens_total``: cumulative over the job's attempted
    steps so far, this one included.

    Overflow forensics, on overflow steps only (None otherwise): ``overflow_ranks``, the ranks whose
    gradients held non-finite values; ``nonfinite_params``, the first parameters (module paths, model
    order) as ``{"name", "kind": "inf" | "nan"}``; ``nonfinite_param_count``, how many in all.
    ``underflow_fraction``: the share of fp16 gradient values that were zero or subnormal, on sampled
    fp16 steps. ``precision``: ``bf16`` on the steps after a precision switch (absent before).

    A step line carries every field but ``precision``, ``null`` where it does not apply.
    """

    type: Literal["step"] = "step"
    step: Step
    loss: float | None = None
    loss_scale: float | None = None
    overflow: bool | None = None
    skipped_steps: int | None = None
    grad_norm: float | None = None
    lr: float | None = None
    samples_per_second: float | None = None
    tokens_per_second: float | None = None
    underflow_fraction: float | None = None
    overflow_ranks: list[int] | None = None
    nonfinite_params: list[dict[str, str]] | None = None
    nonfinite_param_count: int | None = None
    samples_total: int | None = None
    tokens_total: int | None = None
    precision: str | None = None

    def line(self) -> dict[str, object]:
        """The step line: every field (``null`` where it does not apply), ``precision`` only when set."""
        unset = {"type"} | ({"precision"} if "precision" not in self.model_fields_set else set())
        return {"type": self.type, **finite(self.model_dump(mode="json", by_alias=True, exclude=unset))}


class EvalRecord(RecordBase):
    """An evaluation on the held-out split: ``loss`` plus ``accuracy`` (classification) or ``perplexity`` (text)."""

    type: Literal["eval"] = "eval"
    step: Step
    loss: float | None = None
    accuracy: float | None = None
    perplexity: float | None = None


class PrecisionSwitchRecord(RecordBase, PrecisionSwitch):
    """The ``precision_switch`` line: the fp16 job switched to bf16 at ``step`` and goes on from the checkpoint at
    ``rewound_to_step`` (a :class:`PrecisionSwitch` as a record of its own)."""

    type: Literal["precision_switch"] = "precision_switch"


class StoppedEarly(BaseModel):
    """An ``end`` record's ``stopped_early``: the step early stopping ended the job at, its metric, the best evaluation."""

    model_config = _CLOSED

    step: Count
    metric: str
    best_step: Count | None = None
    best_value: float | None = None


class ExportCheck(BaseModel):
    """The merged export checked against the trained model on ``rows`` held-out rows (``trainer/hf/export_check.py``):
    the largest absolute logit difference, and the tolerance it had to stay within, in the export's ``dtype``."""

    rows: Count
    dtype: str
    max_logit_difference: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    tolerance: Annotated[float, Field(gt=0, allow_inf_nan=False)]


class EndRecord(RecordBase):
    """Written last on success: attempted, skipped and applied steps (``applied_steps``: newer trainers only), and
    ``empty_windows``: attempted steps whose window held no supervised token (no update, not skipped; absent when
    none, and from older trainers).

    ``stopped_early`` when early stopping ended the job before ``max_steps``; ``exported_step``: the
    step whose weights the exports hold. ``samples_per_second`` (``tokens_per_second``, null for data
    without tokens): the run's headline throughput, the applied steps' samples (tokens) per second of
    training time after the first step (evaluations and checkpoints left out; absent when not measured).
    ``export_check``: an ``hf`` job's merged export compared with the trained model (absent without one).
    """

    type: Literal["end"] = "end"
    steps: Count
    skipped_steps: Count
    applied_steps: Count | None = None
    empty_windows: Count | None = None
    stopped_early: StoppedEarly | None = None
    exported_step: Count | None = None
    samples_per_second: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    tokens_per_second: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    export_check: ExportCheck | None = None

    @property
    def applied(self) -> int:
        """Steps that applied an update: the smaller of what the record says and attempted minus skipped."""
        derived = self.steps - self.skipped_steps - (self.empty_windows or 0)
        return derived if self.applied_steps is None else min(derived, self.applied_steps)


#: One line of ``records.jsonl``, by its ``type``.
Record = Annotated[
    PhaseRecord | StartRecord | StepRecord | EvalRecord | PrecisionSwitchRecord | EndRecord,
    Field(discriminator="type"),
]
#: The ``type`` of every record.
RECORD_TYPES: frozenset[str] = frozenset({"phase", "start", "step", "eval", "precision_switch", "end"})


@cache
def _adapter() -> TypeAdapter[Record]:
    return TypeAdapter(Record)


def parse_record(data: Mapping[str, Any]) -> Record | None:
    """The record of one line's JSON object; ``None`` for an unknown ``type`` and (logged) for one that does not validate."""
    if data.get("type") not in RECORD_TYPES:
        return None
    try:
        return _adapter().validate_python(dict(data))
    except ValidationError as exc:
        log.warning("skipping a %s record that does not validate: %.200r (%s)", data.get("type"), dict(data), exc)
        return None
