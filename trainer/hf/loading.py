"""Loading an ``hf`` model's base and tokenizer: local files only, safetensors only, float32 weights.

A ``path`` model is read from a directory under one of the worker's model roots
(:data:`trainer.roots.MODEL_ROOTS`, checked by :mod:`trainer.hf.safety` first); an
``hf_config`` model is built from its config with random initialisation (the global torch
RNG: seed it first). ``trust_remote_code`` is never set, nothing is downloaded.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from halfcast.contracts.catalog import HFConfig
from halfcast.contracts.status import FailureReason
from trainer.data.base import DataInfo, Task
from trainer.errors import TrainerError
from trainer.hf.safety import check_model_dir, check_tokenizer_dir
from trainer.registered import registered_model_dir
from trainer.roots import MODEL_ROOTS

if TYPE_CHECKING:
    from halfcast.contracts.spec import JobSpec

log = logging.getLogger(__name__)

#: Vocabulary of byte-level data (the 256 byte values).
BYTE_VOCAB = 256
#: Exceptions ``from_pretrained`` / ``from_config`` raise for a directory or config it cannot use.
_LOAD_ERRORS = (OSError, ValueError, KeyError, TypeError, RuntimeError, ImportError)


def hf_config(spec: JobSpec) -> HFConfig:
    """The model config of an ``hf`` job; ``TypeError`` for any other model (only ``hf`` jobs get here)."""
    if spec.model.name != "hf":
        raise TypeError(f"not an hf job: its model is {spec.model.name!r}")
    return spec.model.config


def _pretrained_dir(config: HFConfig) -> Path | None:
    """Where a ``path`` (under a model root) or ``model_id`` (registered) model is; ``None`` for ``hf_config``."""
    if config.model_id is not None:
        return registered_model_dir(config.model_id)
    if config.path is not None:
        return MODEL_ROOTS.resolve(config.path, kind="dir")
    return None


def model_dir(config: HFConfig) -> Path | None:
    """The checked directory of a ``path`` or ``model_id`` model (``model_unavailable`` if refused), or ``None``."""
    directory = _pretrained_dir(config)
    if directory is not None:
        check_model_dir(directory)
    return directory


def tokenizer_dir(config: HFConfig) -> Path | None:
    """The checked tokenizer directory: ``tokenizer_path``, else the model's own; ``None`` when byte-level."""
    if config.tokenizer_path is not None:
        directory: Path | None = MODEL_ROOTS.resolve(config.tokenizer_path, kind="dir")
    else:
        directory = _pretrained_dir(config)
    if directory is None:
        return None
    check_tokenizer_dir(directory)
    return directory


def load_tokenizer(config: HFConfig, dataset_name: str) -> Any | None:
    """The job's tokenizer (``AutoTokenizer``, local files only), or ``None`` for byte-level data.

    ``text`` datasets are byte-level whatever the model, and so is an ``hf_config`` model
    without a ``tokenizer_path``. Raises ``model_unavailable`` when it cannot be loaded.
    """
    if dataset_name == "text":
        return None
    directory = tokenizer_dir(config)
    if directory is None:
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    except _LOAD_ERRORS as exc:
        raise TrainerError(FailureReason.MODEL_UNAVAILABLE, f"cannot load the tokenizer in {directory}: {exc}") from exc


def load_base_model(config: HFConfig, info: DataInfo, tokenizer: Any | None) -> nn.Module:
    """The float32 Hugging Face model of ``config`` (``*ForCausalLM`` or ``*ForSequenceClassification``),
    sized for ``info``, in training mode. Raises ``model_unavailable`` (unreadable) or ``spec_invalid``
    (it does not fit the data: task, vocabulary, labels, context)."""
    _check_task(config, info)
    directory = model_dir(config)
    hf_config = _pretrained_config(directory) if directory is not None else _scratch_config(config, info, tokenizer)
    if config.task == "sequence_classification":
        hf_config.num_labels = config.num_labels
        if info.label_names is not None:  # what every export's config.json says the classes are
            hf_config.id2label = dict(enumerate(info.label_names))
            hf_config.label2id = {name: number for number, name in enumerate(info.label_names)}
        if hf_config.pad_token_id is None:
            hf_config.pad_token_id = _pad_token_id(tokenizer, hf_config)
    _check_sizes(hf_config, info)
    _check_tokenizer_fits(hf_config, tokenizer)
    model = _instantiate(config, hf_config, directory)
    return model.float().train()


def _check_task(config: HFConfig, info: DataInfo) -> None:
    wanted = Task.LM if config.task == "causal_lm" else Task.CLASSIFICATION
    if info.task is not wanted or info.seq_len is None:
        msg = f"hf task '{config.task}' needs {wanted.value} token data, got {info.task.value}"
        raise TrainerError(FailureReason.SPEC_INVALID, msg)
    if config.task == "sequence_classification" and info.num_outputs != config.num_labels:
        msg = f"num_labels is {config.num_labels} but the dataset has {info.num_outputs} classes"
        raise TrainerError(FailureReason.SPEC_INVALID, msg)


def _pretrained_config(directory: Path) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    except _LOAD_ERRORS as exc:
        raise TrainerError(
            FailureReason.MODEL_UNAVAILABLE, f"cannot read the model config in {directory}: {exc}"
        ) from exc


def _scratch_config(config: HFConfig, info: DataInfo, tokenizer: Any | None) -> Any:
    """``AutoConfig.for_model`` of ``hf_config``; the vocabulary defaults to the tokenizer's (or 256 bytes)."""
    from transformers import AutoConfig

    fields = dict(config.hf_config or {})
    model_type = fields.pop("model_type")
    if not isinstance(model_type, str):  # (HFConfig lets no other through)
        raise TrainerError(FailureReason.SPEC_INVALID, "hf_config needs a model_type (e.g. 'llama')")
    if tokenizer is not None:
        fields.setdefault("vocab_size", len(tokenizer))
    elif info.task is Task.LM or config.byte_level:
        fields.setdefault("vocab_size", BYTE_VOCAB)
    try:
        return AutoConfig.for_model(model_type, **fields)
    except _LOAD_ERRORS as exc:
        raise TrainerError(
            FailureReason.SPEC_INVALID, f"hf_config does not describe a transformers model: {exc}"
        ) from exc


def _pad_token_id(tokenizer: Any | None, hf_config: Any) -> int:
    """The id sequence classification pools up to: the tokenizer's pad (else eos) token; byte-level: 0."""
    for candidate in (
        getattr(tokenizer, "pad_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
        getattr(hf_config, "eos_token_id", None),
    ):
        if isinstance(candidate, int):
            return candidate
    return 0


def _check_sizes(hf_config: Any, info: DataInfo) -> None:
    vocab = getattr(hf_config, "vocab_size", None)
    if info.task is Task.LM and (not isinstance(vocab, int) or vocab < info.vocab_size):
        msg = f"the model's vocab_size ({vocab}) is smaller than the data's vocabulary ({info.vocab_size})"
        raise TrainerError(FailureReason.SPEC_INVALID, msg)
    context = getattr(hf_config, "max_position_embeddings", None)
    if isinstance(context, int) and info.seq_len is not None and info.seq_len > context:
        msg = f"seq_len {info.seq_len} exceeds the model's max_position_embeddings ({context})"
        raise TrainerError(FailureReason.SPEC_INVALID, msg)


def _check_tokenizer_fits(hf_config: Any, tokenizer: Any | None) -> None:
    """Every id the tokenizer can produce has a row in the model's embedding (whatever the task): a
    tokenizer with added tokens the model was never resized for would index past the embedding (a
    device-side assert on CUDA) at the first such token."""
    vocab = getattr(hf_config, "vocab_size", None)
    if tokenizer is None or not isinstance(vocab, int) or len(tokenizer) <= vocab:
        return
    msg = (
        f"the tokenizer has {len(tokenizer)} tokens but the model embeds only {vocab} (vocab_size): "
        "ids from {vocab} up would index past the embedding; use the model's own tokenizer or a resized model"
    )
    raise TrainerError(FailureReason.SPEC_INVALID, msg.replace("{vocab}", str(vocab)))


def _auto_class(config: HFConfig) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    return AutoModelForCausalLM if config.task == "causal_lm" else AutoModelForSequenceClassification


def _instantiate(config: HFConfig, hf_config: Any, directory: Path | None) -> nn.Module:
    """Read the weights (safetensors, local) or initialise them from the config, in float32, SDPA attention.

    Weights that cannot be read (a corrupt or renamed ``*.safetensors``: ``SafetensorError``) are
    ``model_unavailable``, like a missing file, never a rank's crash.
    """
    from safetensors import SafetensorError

    auto = _auto_class(config)
    common = {"dtype": torch.float32, "attn_implementation": "sdpa", "trust_remote_code": False}
    try:
        if directory is None:
            return auto.from_config(hf_config, **common)
        return auto.from_pretrained(
            str(directory), config=hf_config, local_files_only=True, use_safetensors=True, **common
        )
    except (*_LOAD_ERRORS, SafetensorError) as exc:
        where = directory if directory is not None else f"hf_config model_type {hf_config.model_type!r}"
        reason = FailureReason.MODEL_UNAVAILABLE if directory is not None else FailureReason.SPEC_INVALID
        raise TrainerError(reason, f"cannot build the model from {where}: {exc}") from exc
