"""The records sink: rank 0 appends JSON lines to ``<run_dir>/records.jsonl``.

Line types and fields are the run-directory contract of docs/architecture.md and the
step record of docs/results.md ("Step records"). Lines are flushed as soon as they are
written (step lines in one batch per logging interval, see :mod:`trainer.telemetry`),
so the worker can tail the file while training runs. JSON has no NaN or infinity: a
non-finite float is written as ``null``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Self

RECORDS_FILE = "records.jsonl"


@dataclass(frozen=True)
class StepRecord:
    """One attempted optimizer step (docs/results.md, "Step records").

    ``step``: 1-based attempted step; ``loss``: global mean loss of the window;
    ``loss_scale``: scale used for this step (1.0 without scaling); ``overflow``:
    non-finite gradients were found and the update skipped; ``skipped_steps``:
    cumulative; ``grad_norm``: pre-clip L2 norm of the unscaled gradients (None when
    skipped); ``lr``: learning rate used for this step; throughput in samples (tokens)
    per second over all ranks, measured over the logging interval the step belongs to
    (samples of the interval / its wall time; ``tokens_per_second`` None for non-token data);
    ``samples_total``/``tokens_total``: cumulative over all attempted steps of the job so
    far, this one included (``tokens_total`` None for non-token data).

    Overflow forensics (:mod:`trainer.forensics`), set on overflow steps only (None
    otherwise): ``overflow_ranks``, the ranks whose gradients held non-finite values;
    ``nonfinite_params``, the first parameters (module paths, model order) with their
    kind, ``{"name", "kind": "inf" | "nan"}``; ``nonfinite_param_count``, how many in all
    (0 when the overflow came from elsewhere, e.g. an fp8 quantisation). Underflow
    telemetry (:mod:`trainer.underflow`): ``underflow_fraction``, the fraction of fp16
    gradient values that were zero or subnormal, on sampled fp16 steps (None otherwise).
    """

    step: int
    loss: float | None
    loss_scale: float
    overflow: bool
    skipped_steps: int
    grad_norm: float | None
    lr: float
    samples_per_second: float
    tokens_per_second: float | None
    underflow_fraction: float | None = None
    overflow_ranks: list[int] | None = None
    nonfinite_params: list[dict[str, str]] | None = None
    nonfinite_param_count: int | None = None
    samples_total: int | None = None
    tokens_total: int | None = None


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {key: _finite_or_none(item) for key, item in value.items()}
    return value


class RecordSink:
    """Appends one JSON object per line to ``path``; with ``path=None`` (ranks other than 0) it writes nothing.

    Use as a context manager, or call :meth:`close`. ``OSError`` from the file system propagates.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        #: Fields merged into every later ``step`` line (``{"precision": "bf16"}`` after a precision switch).
        self.step_fields: dict[str, Any] = {}
        self._file: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8")

    def write(self, kind: str, fields: Mapping[str, Any], when: float | None = None) -> None:
        """Append ``{"type": kind, "time": when or now (unix seconds), **fields}`` and flush."""
        self._write_line(kind, fields, when)
        if self._file is not None:
            self._file.flush()

    def _write_line(self, kind: str, fields: Mapping[str, Any], when: float | None) -> None:
        if self._file is None:
            return
        record = {"type": kind, "time": time.time() if when is None else when, **_finite_or_none(fields)}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")

    def start(self, **fields: Any) -> None:
        """The ``start`` line: world_size, device, precision, compute_dtype, accumulation_steps, ..., startup."""
        self.write("start", fields)

    def phase(self, phase: str, startup: Mapping[str, float | None]) -> None:
        """A ``phase`` line: start-up phase ``phase`` begins; ``startup``: the seconds of those ended (:mod:`trainer.startup`)."""
        self.write("phase", {"phase": phase, "startup": dict(startup)})

    def step(self, record: StepRecord, when: float | None = None) -> None:
        """A ``step`` line from a :class:`StepRecord` (``when``: the step's unix time, default now)."""
        self.write("step", {**asdict(record), **self.step_fields}, when)

    def steps(self, records: Iterable[tuple[float, StepRecord]]) -> None:
        """``step`` lines for ``(unix time, record)`` pairs, flushed once at the end."""
        for when, record in records:
            self._write_line("step", {**asdict(record), **self.step_fields}, when)
        if self._file is not None:
            self._file.flush()

    def eval(self, step: int, metrics: Mapping[str, float | None]) -> None:
        """An ``eval`` line: ``step`` and ``loss`` plus ``accuracy`` or ``perplexity`` (:mod:`trainer.evaluate`)."""
        self.write("eval", {"step": step, **metrics})

    def precision_switch(self, switch: Mapping[str, Any]) -> None:
        """A ``precision_switch`` line (``on_divergence: "fallback_bf16"``, see :mod:`trainer.fallback`).

        ``switch``: ``step`` (where the divergence guard tripped), ``from``, ``to``,
        ``reason`` (the guard's typed reason), ``message``, ``rewound_to_step`` (the
        checkpoint step training continues from, 0 for the start) and ``time`` (unix
        seconds, the line's time).
        """
        fields = {key: value for key, value in switch.items() if key != "time"}
        self.write("precision_switch", fields, switch.get("time"))

    def end(self, steps: int, skipped_steps: int, **fields: Any) -> None:
        """The ``end`` line, written last on success: attempted, skipped and applied (the difference) steps.

        ``fields``: ``stopped_early`` (``{"step", "metric", "best_step", "best_value"}``, when early
        stopping ended the job at ``steps`` before ``max_steps``) and ``exported_step`` (the step
        whose weights an ``hf`` job's exports hold: the best evaluated one with ``keep_best``).
        """
        self.write("end", {"steps": steps, "skipped_steps": skipped_steps, "applied_steps": steps - skipped_steps,
                           **fields})

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """All complete lines of ``<run_dir>/records.jsonl`` as dicts (for tests and tools)."""
    path = run_dir / RECORDS_FILE
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]
