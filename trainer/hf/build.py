"""The :class:`HFModule` of an ``hf`` job: base model, optional LoRA adapter, frozen-weight dtype."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from halfcast.contracts.spec import JobSpec
from trainer.data.base import DataInfo
from trainer.hf.adapters import apply_lora, cast_frozen, check_trainable
from trainer.hf.loading import hf_config, load_base_model
from trainer.hf.wrapper import HFModule
from trainer.rng import seed_everything

log = logging.getLogger(__name__)


def build_hf_model(
    spec: JobSpec, info: DataInfo, tokenizer: Any | None, compute_dtype: torch.dtype, *, base_as_stored: bool = False
) -> HFModule:
    """The model an ``hf`` job trains (uses the global torch RNG: seed it first).

    Without an adapter every parameter trains (float32). With one, only the adapter and a
    classification head train; frozen base weights are cast to ``compute_dtype`` when the
    job's effective ``base_dtype`` is ``compute``, unless ``base_as_stored`` (the exports: the
    base exactly as read, in float32). Raises :class:`trainer.errors.TrainerError`
    (``model_unavailable``, ``spec_invalid``).
    """
    config = hf_config(spec)
    model: nn.Module = load_base_model(config, info, tokenizer)
    causal = _is_causal(model)
    if spec.adapter is not None:
        model = apply_lora(model, spec.adapter, config)
        check_trainable(model)
        if spec.effective_base_dtype == "compute" and compute_dtype != torch.float32 and not base_as_stored:
            cast = cast_frozen(model, compute_dtype)
            log.info("adapter job: %d frozen base parameters kept in %s", cast, compute_dtype)
    return HFModule(model, causal=causal, adapter=spec.adapter is not None)


def rebuild_hf_model(
    spec: JobSpec,
    info: DataInfo,
    tokenizer: Any | None,
    compute_dtype: torch.dtype,
    model_state: Mapping[str, Any],
    *,
    base_as_stored: bool = False,
) -> HFModule:
    """The float32 CPU model an ``hf`` job trained, from its (checkpointed) ``model_state``, in eval mode.

    The model is rebuilt exactly as the job built it: seeded with ``spec.seed`` (a random-init base
    or adapter is the job's), frozen weights in ``compute_dtype`` for ``base_dtype`` ``compute``;
    then ``model_state`` is loaded (an adapter job's holds only the trainable state) and everything
    is cast to float32. ``base_as_stored``: the frozen base weights as read from disk instead (what
    the exports merge into; the adapter was trained on them rounded to ``compute_dtype``). The
    caller's RNG state is left as it was.
    """
    with torch.random.fork_rng(devices=[]):
        seed_everything(spec.seed)
        model = build_hf_model(spec, info, tokenizer, compute_dtype, base_as_stored=base_as_stored)
    model.load_state_dict({k: v.to("cpu") for k, v in model_state.items()})
    return model.float().eval()


def _is_causal(model: nn.Module) -> bool:
    """Whether the model's attention is causal (Hugging Face attention modules carry ``is_causal``)."""
    return any(getattr(module, "is_causal", False) is True for module in model.modules())
