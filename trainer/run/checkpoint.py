"""Checkpoints: everything needed to resume a job exactly, written atomically by rank 0.

A checkpoint is a ``torch.save`` dict with ``model`` (unwrapped state dict; for an ``hf``
adapter job only its trainable parameters, see :func:`checkpointed_model_state`),
``optimizer``, ``lr_scheduler``, ``precision`` (loss-scaler state, skipped-step and
empty-window counters, from ``PrecisionPolicy.state_dict()``; a checkpoint written before
empty windows were counted loads with 0 of them), ``step`` (attempted steps done),
``counters`` (divergence-guard counters), ``rng`` (every rank's generator states,
by rank), ``spec`` (the job spec as JSON data, as the user gave it), ``best_evaluation``
(the best evaluation so far and the evaluations since, :mod:`trainer.run.early_stopping`) and, once a job
fell back from fp16 to bf16, ``precision_switch`` (the switch; the other parts are then
bf16's, see :mod:`trainer.run.fallback`).
It is written to a temporary file in the same directory, fsynced, then moved into
place with ``os.replace``, so a reader never sees a partial file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import torch
from torch import nn

from halfcast.contracts.rundir import RunDir
from halfcast.contracts.spec import JobSpec
from trainer.numerics.precision import PrecisionPolicy, PrecisionState
from trainer.optim.schedule import DeviceLRSchedule, SchedulerState
from trainer.parallel.sharded import load_state_dicts
from trainer.rng import RngState

if TYPE_CHECKING:
    from trainer.data.base import DataInfoEntry
    from trainer.run.early_stopping import TrackerState


class CheckpointExtras(TypedDict, total=False):
    """The entries a checkpoint holds besides the training state, written in this order after ``spec``."""

    #: The dataset sizes the model was built for (:data:`trainer.export.DATA_INFO_KEY`).
    data_info: DataInfoEntry
    #: The input files' fingerprints (:data:`trainer.inputs.INPUTS_KEY`).
    inputs: dict[str, str]
    #: The fp16-to-bf16 switch, once made (:data:`trainer.run.resume.PRECISION_SWITCH_KEY`): a
    #: :class:`~halfcast.contracts.records.PrecisionSwitch`'s JSON data, validated where it is read.
    precision_switch: dict[str, object]
    #: The best evaluation so far (:data:`trainer.run.early_stopping.TRACKER_KEY`).
    best_evaluation: TrackerState


class CheckpointPayload(CheckpointExtras):
    """What ``torch.save`` writes (see the module docstring); the extras are absent from older checkpoints."""

    rng: list[RngState]
    # open mapping: a torch state_dict (for an adapter job only its trainable part)
    model: dict[str, Any]
    # open mapping: a torch optimizer state_dict (parameter names as keys under FSDP2)
    optimizer: dict[str, Any]
    lr_scheduler: SchedulerState
    precision: PrecisionState
    step: int
    counters: dict[str, int]
    #: The job spec as JSON data, as the user gave it (validated as a ``JobSpec`` where it is read).
    spec: dict[str, object]


def step_path(run_dir: Path, step: int) -> Path:
    """``<run_dir>/checkpoints/step-<step>.pt`` (:class:`halfcast.contracts.rundir.RunDir`)."""
    return RunDir(run_dir).step_checkpoint(step)


def final_path(run_dir: Path) -> Path:
    """``<run_dir>/checkpoints/final.pt`` (:class:`halfcast.contracts.rundir.RunDir`)."""
    return RunDir(run_dir).final_checkpoint


@dataclass(frozen=True)
class TrainingState:
    """The objects a checkpoint captures (``model`` unwrapped, not DDP)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    lr_scheduler: DeviceLRSchedule
    precision: PrecisionPolicy


def save_checkpoint(
    path: Path,
    state: TrainingState,
    *,
    step: int,
    counters: Mapping[str, int],
    spec: JobSpec,
    rng: Sequence[RngState] = (),
    model_state: Mapping[str, Any] | None = None,
    optimizer_state: Mapping[str, Any] | None = None,
    extra: CheckpointExtras | None = None,
) -> None:
    """Write ``state`` at attempted step ``step`` to ``path`` atomically. ``OSError`` propagates.

    ``rng`` holds every rank's generator states, indexed by rank (see :mod:`trainer.rng`).
    ``model_state`` / ``optimizer_state``: state dicts gathered beforehand by every rank
    (:func:`trainer.parallel.sharded.gather_state_dicts`, needed under FSDP2); default: ``state``'s own.
    ``extra``: more top-level entries (e.g. ``precision_switch``, see :mod:`trainer.run.fallback`).
    """
    payload: CheckpointPayload = {
        "rng": [RngState(**r) for r in rng],
        "model": checkpointed_model_state(
            state.model, state.model.state_dict() if model_state is None else model_state
        ),
        "optimizer": state.optimizer.state_dict() if optimizer_state is None else dict(optimizer_state),
        "lr_scheduler": state.lr_scheduler.state_dict(),
        "precision": state.precision.state_dict(),
        "step": step,
        "counters": dict(counters),
        "spec": spec.model_dump(mode="json"),
    }
    if extra:
        payload.update(extra)  # after ``spec``, in ``extra``'s order
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def checkpointed_model_state(model: nn.Module, full: Mapping[str, Any]) -> dict[str, Any]:  # open mapping: state_dict
    """The part of ``full`` a checkpoint keeps: all of it, or only the keys of ``model.checkpoint_keys()``
    when the model has one (an adapter job keeps its trainable state; the base is rebuilt from the spec)."""
    keys_of = getattr(model, "checkpoint_keys", None)
    keys = keys_of() if callable(keys_of) else None
    return dict(full) if keys is None else {k: v for k, v in full.items() if k in keys}


def load_checkpoint(path: Path, state: TrainingState | None = None) -> CheckpointPayload:
    """Read a checkpoint (on CPU) and, if ``state`` is given, restore every part of it in place.

    Returns the raw checkpoint dict (``step``, ``counters`` and ``spec`` included; an older
    checkpoint's precision state without ``empty_windows`` gets 0 of them).
    Raises ``FileNotFoundError`` for a missing file, and whatever ``load_state_dict``
    raises for a mismatching model, optimizer, scheduler or precision.
    """
    payload: CheckpointPayload = torch.load(path, map_location="cpu", weights_only=True)
    payload["precision"].setdefault("empty_windows", 0)  # older checkpoints did not count them
    if state is not None:
        restore_state(payload, state)
    return payload


def restore_state(payload: Mapping[str, Any], state: TrainingState) -> None:
    """Load a checkpoint's model, optimizer, scheduler and precision parts into ``state`` in place."""
    load_state_dicts(state.model, state.optimizer, payload["model"], payload["optimizer"])  # collective under FSDP2
    state.lr_scheduler.load_state_dict(payload["lr_scheduler"])
    state.precision.load_state_dict(payload["precision"])
