"""A job spec's references (``dataset_id``, ``model_id``, ``resume_from``): looked up, checked, filled in.

Every reference a spec holds names something of an owner: a registered dataset, a registered
model, or a job (``resume_from``'s first part; the rest is a path inside that job's run
directory). The API checks them at submission (one the caller cannot see is a ``422`` at its
field, worded as for one that does not exist; a ``format``, ``file_format`` or ``sha256`` given
with a ``dataset_id`` must be the registered dataset's) and stores the spec as submitted. The
worker checks them again for the job's owner before each attempt, before it opens anything
(:mod:`worker.lifecycle.registered_inputs`), and fills in the dataset's ``format``, ``file_format`` and
``sha256`` (the trainer finds the file by them and checks its hash) in the copy it writes as
the run's ``spec.json``; a model needs nothing filled in (its directory is named by its id).
A reference added to the spec later belongs here too. Torch-free; works on a Session or a Connection.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from halfcast.contracts.status import FailureReason
from halfcast.core.db.models import Job, RegisteredDataset, RegisteredModel

#: Where pydantic locates a ``jsonl`` dataset's and an ``hf`` model's config in a job spec.
DATASET_CONFIG = ("dataset", "jsonl", "config")
MODEL_CONFIG = ("model", "hf", "config")
#: Where a job spec names the job (and the checkpoint in its run directory) it resumes from.
RESUME_FROM = ("resume_from",)
#: The fields of a dataset config the registry fills in.
DATASET_FIELDS = ("format", "file_format", "sha256")

Executor = Session | Connection
#: Whether the caller may use an input of this owner (``None``: a job from before authentication).
Visible = Callable[[str | None], bool]


class RefError(Exception):
    """A registered input the spec names cannot be used: at ``loc`` (in the spec), with the failure ``reason``
    a worker records (``data_unavailable``, ``model_unavailable``)."""

    def __init__(self, loc: tuple[str, ...], message: str, value: object, reason: FailureReason) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message
        self.value = value
        self.reason = reason


def _config(spec: Mapping[str, object], block: str, name: str) -> dict[str, object] | None:
    """The ``config`` of the spec's ``block`` when that block is ``name``'s (the dict itself: filling it fills the spec)."""
    entry = spec.get(block)
    if not isinstance(entry, dict) or entry.get("name") != name:
        return None
    config = entry.get("config")
    return config if isinstance(config, dict) else None


def dataset_id_of(spec: Mapping[str, object]) -> str | None:
    """The ``dataset_id`` a (JSON) spec names, if any."""
    config = _config(spec, "dataset", "jsonl")
    found = config.get("dataset_id") if config is not None else None
    return found if isinstance(found, str) else None  # (a validated spec's is a string)


def model_id_of(spec: Mapping[str, object]) -> str | None:
    """The ``model_id`` a (JSON) spec names, if any."""
    config = _config(spec, "model", "hf")
    found = config.get("model_id") if config is not None else None
    return found if isinstance(found, str) else None  # (a validated spec's is a string)


def resume_job_id_of(spec: Mapping[str, object]) -> str | None:
    """The job a (JSON) spec's ``resume_from`` names (its first part), if any."""
    resume_from = spec.get("resume_from")
    return resume_from.split("/", 1)[0] if isinstance(resume_from, str) else None


def names_registered_inputs(spec: Mapping[str, object]) -> bool:
    """Whether the spec holds a reference: a registered dataset or model, or a job to resume from."""
    return dataset_id_of(spec) is not None or model_id_of(spec) is not None or resume_job_id_of(spec) is not None


def _fill_dataset(executor: Executor, config: dict[str, object], visible: Visible) -> None:
    dataset_id = config["dataset_id"]
    columns = (
        RegisteredDataset.owner,
        RegisteredDataset.format,
        RegisteredDataset.file_format,
        RegisteredDataset.sha256,
    )
    row = executor.execute(select(*columns).where(RegisteredDataset.id == dataset_id)).one_or_none()
    if row is None or not visible(row.owner):
        msg = f"no registered dataset {dataset_id}"
        raise RefError((*DATASET_CONFIG, "dataset_id"), msg, dataset_id, FailureReason.DATA_UNAVAILABLE)
    for field in DATASET_FIELDS:
        given, registered = config.get(field), getattr(row, field)
        if given is not None and given != registered:
            msg = f"dataset {dataset_id} has {field} {registered!r}, not {given!r}"
            raise RefError((*DATASET_CONFIG, field), msg, given, FailureReason.DATA_UNAVAILABLE)
        config[field] = registered


def _check_model(executor: Executor, model_id: str, visible: Visible) -> None:
    owner = executor.execute(select(RegisteredModel.owner).where(RegisteredModel.id == model_id)).scalar_one_or_none()
    if owner is None or not visible(owner):
        msg = f"no registered model {model_id}"
        raise RefError((*MODEL_CONFIG, "model_id"), msg, model_id, FailureReason.MODEL_UNAVAILABLE)


def _check_resume(executor: Executor, resume_from: str, job_id: str, visible: Visible) -> None:
    owner = executor.execute(select(Job.owner).where(Job.id == job_id)).one_or_none()
    if owner is None or not visible(owner[0]):
        msg = f"no job {job_id} to resume from"
        raise RefError(RESUME_FROM, msg, resume_from, FailureReason.CHECKPOINT_UNAVAILABLE)


def resolve_refs(executor: Executor, spec: dict[str, object], visible: Visible) -> dict[str, object]:
    """A copy of the JSON ``spec`` with its registered dataset's ``format``, ``file_format`` and ``sha256``
    filled in; :class:`RefError` for a reference that names nothing ``visible`` accepts, or a given value that is not the
    registered one. A spec holding no reference comes back equal."""
    resolved = copy.deepcopy(spec)
    resume_from = resolved.get("resume_from")
    if isinstance(resume_from, str):  # (what resume_job_id_of finds)
        _check_resume(executor, resume_from, resume_from.split("/", 1)[0], visible)
    dataset = _config(resolved, "dataset", "jsonl")
    if dataset is not None and dataset.get("dataset_id") is not None:
        _fill_dataset(executor, dataset, visible)
    model_id = model_id_of(resolved)
    if model_id is not None:
        _check_model(executor, model_id, visible)
    return resolved
