"""The trained model of a checkpoint, rebuilt for inference: ``load_trained_model("final.pt")``.

A checkpoint (:mod:`trainer.run.checkpoint`) holds the job's ``spec`` and, since this
module exists, ``data_info`` (the dataset sizes the model was built for: task, outputs,
input width or context length). The model is rebuilt from the spec's ``model`` entry
and those sizes (:func:`trainer.models.build_model`), in float32, and the checkpoint's
``model`` state dict is loaded into it strictly (an ``hf`` adapter job's checkpoint holds only the
trainable state: the base is rebuilt from the spec, read from the worker's model roots, so
``HALFCAST_MODEL_ROOTS`` must name them here too; ``<run_dir>/export/`` has the same model in
Hugging Face formats, :mod:`trainer.hf.export`). Checkpoints written before
``data_info`` was stored get the sizes from the dataset itself, which must then be
readable here (``data_unavailable`` otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import torch
from pydantic import TypeAdapter
from torch import nn

from halfcast.contracts.catalog import DatasetSpec, ModelSpec
from trainer.data import build_dataset
from trainer.data.base import DataInfo, DataInfoEntry, Task
from trainer.models import build_model

if TYPE_CHECKING:
    from trainer.run.checkpoint import CheckpointPayload

#: Key of the dataset sizes in a checkpoint.
DATA_INFO_KEY: Final = "data_info"


def data_info_entry(info: DataInfo) -> DataInfoEntry:
    """``info`` as plain data a ``weights_only`` load accepts (the task as its string value)."""
    return {
        "task": Task(info.task).value,
        "num_outputs": info.num_outputs,
        "in_features": info.in_features,
        "seq_len": info.seq_len,
        "label_names": info.label_names,
    }


def checkpoint_data_info(payload: Mapping[str, Any]) -> DataInfo:
    """The dataset sizes the checkpoint's model was built for (read from the dataset for older checkpoints)."""
    entry = payload.get(DATA_INFO_KEY)
    if entry is not None:
        return DataInfo(**{**entry, "task": Task(entry["task"])})
    dataset_spec = TypeAdapter(DatasetSpec).validate_python(payload["spec"]["dataset"])
    return build_dataset(dataset_spec).info


def load_trained_model(path: str | Path, map_location: str | torch.device = "cpu") -> nn.Module:
    """The float32 model of checkpoint ``path`` with its trained weights, in eval mode, on ``map_location``.

    Reads the file with ``torch.load(weights_only=True)`` (no arbitrary code runs).

    Raises:
        FileNotFoundError: no file at ``path``.
        KeyError: not a Halfcast checkpoint (no ``spec`` or ``model`` entry).
        RuntimeError: the weights do not fit the model the spec describes (``load_state_dict``).
        trainer.errors.TrainerError: an older checkpoint whose dataset cannot be read here.
    """
    payload: CheckpointPayload = torch.load(path, map_location=map_location, weights_only=True)
    model_spec = TypeAdapter(ModelSpec).validate_python(payload["spec"]["model"])
    if model_spec.name == "hf":
        return _hf_model(payload, map_location)
    model = build_model(model_spec, checkpoint_data_info(payload))
    model.load_state_dict(payload["model"])
    return model.to(map_location).eval()


def _hf_model(payload: Mapping[str, Any], map_location: str | torch.device) -> nn.Module:
    """An ``hf`` job's :class:`trainer.hf.wrapper.HFModule`: the base rebuilt from the spec exactly as
    the job built it (seeded; frozen weights in the job's compute dtype for ``base_dtype`` ``compute``),
    the checkpoint's trainable state loaded, then everything cast to float32."""
    from halfcast.contracts.spec import JobSpec
    from trainer.hf.build import rebuild_hf_model
    from trainer.hf.loading import hf_config, load_tokenizer
    from trainer.numerics.precision import COMPUTE_DTYPES

    spec = JobSpec.model_validate(payload["spec"])
    precision = payload.get("precision_switch", {}).get("to", spec.precision)
    tokenizer = load_tokenizer(hf_config(spec), spec.dataset.name)
    model = rebuild_hf_model(
        spec, checkpoint_data_info(payload), tokenizer, COMPUTE_DTYPES[precision], payload["model"]
    )
    return model.to(map_location)
