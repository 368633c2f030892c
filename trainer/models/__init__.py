"""Model registry: ``build_model(spec.model, dataset.info)`` builds the ``nn.Module`` a job trains.

Input and output sizes come from the dataset (:class:`trainer.data.DataInfo`), so a
spec names only the architecture. Parameters are float32 (master weights); autocast
chooses the compute dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import torch
from torch import nn

from halfcast.contracts.catalog import GPTConfig, MLPConfig, ModelSpec
from halfcast.contracts.status import FailureReason
from trainer.data.base import DataInfo
from trainer.errors import TrainerError
from trainer.models.gpt import GPT
from trainer.models.mlp import build_mlp

if TYPE_CHECKING:
    from halfcast.contracts.spec import JobSpec

__all__ = ["MODELS", "build_job_model", "build_model", "model_summary"]


def _mlp(config: MLPConfig, info: DataInfo) -> nn.Module:
    if info.in_features is None:
        raise TrainerError(FailureReason.SPEC_INVALID, "model 'mlp' needs feature data (a dataset with in_features)")
    return build_mlp(info.in_features, info.num_outputs, config.hidden_sizes, config.activation, config.dropout)


def _gpt(config: GPTConfig, info: DataInfo) -> nn.Module:
    if info.seq_len is None:
        raise TrainerError(FailureReason.SPEC_INVALID, "model 'gpt' needs token data (a dataset with seq_len)")
    if config.d_model % config.n_head:
        msg = f"gpt d_model ({config.d_model}) must be divisible by n_head ({config.n_head})"
        raise TrainerError(FailureReason.SPEC_INVALID, msg)
    return GPT(
        vocab_size=info.vocab_size,
        context=info.seq_len,
        n_layer=config.n_layer,
        n_head=config.n_head,
        d_model=config.d_model,
        dropout=config.dropout,
    )


#: Registry name -> builder taking the entry's typed config and the dataset's sizes.
MODELS: dict[str, Callable[[Any, DataInfo], nn.Module]] = {"mlp": _mlp, "gpt": _gpt}


def build_model(spec: ModelSpec, info: DataInfo) -> nn.Module:
    """The float32 model named by ``spec`` (``{"name", "config"}``), sized for ``info``.

    Uses the global torch RNG for initialisation (seed it first for identical ranks).
    Raises :class:`TrainerError` (``spec_invalid``) when the model cannot be built for
    this data, ``KeyError`` for a name without a builder.
    """
    return MODELS[spec.name](spec.config, info)


def build_job_model(spec: JobSpec, info: DataInfo, tokenizer: Any | None, compute_dtype: torch.dtype) -> nn.Module:
    """The model a job trains: :func:`build_model`, or for ``hf`` the :class:`trainer.hf.wrapper.HFModule`
    with its adapter (``compute_dtype``: where an adapter job may keep its frozen base weights)."""
    if spec.model.name == "hf":
        from trainer.hf.build import build_hf_model

        return build_hf_model(spec, info, tokenizer, compute_dtype)
    return build_model(spec.model, info)


#: :func:`model_summary`: the ``start`` record's ``model`` (``class`` is a keyword, hence the functional form).
ModelSummary = TypedDict(
    "ModelSummary",
    {"class": str, "parameters": int, "trainable_parameters": int, "parameter_bytes_by_dtype": dict[str, int]},
)


def model_summary(model: nn.Module) -> ModelSummary:
    """``{class, parameters, trainable_parameters, parameter_bytes_by_dtype}`` of ``model`` (shared tensors once)."""
    params = list({id(p): p for p in model.parameters()}.values())
    by_dtype: dict[str, int] = {}
    for param in params:
        key = str(param.dtype).removeprefix("torch.")
        by_dtype[key] = by_dtype.get(key, 0) + param.numel() * param.element_size()
    return {
        "class": getattr(model, "architecture", type(model).__name__),
        "parameters": sum(p.numel() for p in params),
        "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
        "parameter_bytes_by_dtype": dict(sorted(by_dtype.items())),
    }
