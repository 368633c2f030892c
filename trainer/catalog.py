"""Torch-free catalogue of the models and datasets a job spec may name.

Each entry is a pydantic model ``{"name": <literal>, "config": <typed config>}``;
:mod:`trainer.spec` joins them into discriminated unions, so an unknown name or a
bad config value is a validation error that names the field (HTTP 422 in the API).
The torch code that builds each entry lives in :mod:`trainer.models` and
:mod:`trainer.data`; this module must never import torch.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError


class _Strict(BaseModel):
    """Base for every spec block: unknown fields are rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def field_error(model: str, field: str, message: str, value: object) -> ValidationError:
    """A ``ValidationError`` located at ``field`` (so the API's 422 names it)."""
    detail = InitErrorDetails(type=PydanticCustomError("value_error", message), loc=(field,), input=value)
    return ValidationError.from_exception_data(model, [detail])


def root_path_problem(path: str, root: str) -> str | None:
    """Why ``path`` cannot name something under a ``root`` (not printable, absolute, ``..``), or ``None``."""
    if not path.isprintable():
        return "path must be printable text (no control characters or NUL)"
    if path.startswith(("/", "\\")) or ".." in path.replace("\\", "/").split("/"):
        return f"path must be relative to a {root}, without '..'"
    return None


# ----------------------------------------------------------------------------- models


class MLPConfig(_Strict):
    """Multi-layer perceptron; input and output sizes come from the dataset."""

    hidden_sizes: Annotated[list[Annotated[int, Field(ge=1, le=65536)]], Field(max_length=32)] = [128]
    activation: Literal["relu", "gelu", "tanh"] = "relu"
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0


class MLPModel(_Strict):
    name: Literal["mlp"]
    config: MLPConfig = MLPConfig()


class GPTConfig(_Strict):
    """Small GPT-style causal decoder; vocabulary and context length come from the dataset."""

    n_layer: Annotated[int, Field(ge=1, le=96)] = 2
    n_head: Annotated[int, Field(ge=1, le=128)] = 4
    d_model: Annotated[int, Field(ge=8, le=16384)] = 128
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0

    @model_validator(mode="after")
    def _heads_divide_width(self) -> Self:
        if self.d_model % self.n_head:
            msg = f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})"
            raise field_error("GPTConfig", "d_model", msg, self.d_model)
        return self


class GPTModel(_Strict):
    name: Literal["gpt"]
    config: GPTConfig = GPTConfig()


#: Largest ``hf_config`` accepted, as JSON text.
MAX_HF_CONFIG_BYTES = 16384
#: Upper bounds of the size fields of an ``hf_config`` (a from-scratch model stays bounded).
HF_CONFIG_LIMITS: dict[str, int] = {
    "hidden_size": 16384, "intermediate_size": 65536, "num_hidden_layers": 256, "num_attention_heads": 256,
    "num_key_value_heads": 256, "vocab_size": 1 << 20, "max_position_embeddings": 1 << 20, "head_dim": 1024,
}
#: ``hf_config`` keys that would make Hugging Face run code from elsewhere.
HF_CONFIG_FORBIDDEN = frozenset({"auto_map", "trust_remote_code", "_name_or_path", "name_or_path"})


class HFConfig(_Strict):
    """A Hugging Face transformers model: a local pretrained directory (``path``, relative to one of the
    worker's model roots, safetensors weights only) or a from-scratch ``hf_config`` (random init).

    ``task``: ``causal_lm`` (logits ``[B, T, V]``) or ``sequence_classification`` (``num_labels``
    classes, logits ``[B, num_labels]``). ``tokenizer_path``: a tokenizer directory under a model
    root (default: ``path`` itself; an ``hf_config`` model without one is byte-level, vocabulary 256).
    """

    path: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    hf_config: dict[str, Any] | None = None
    task: Literal["causal_lm", "sequence_classification"] = "causal_lm"
    num_labels: Annotated[int, Field(ge=2, le=65536)] | None = None
    tokenizer_path: Annotated[str, Field(min_length=1, max_length=1024)] | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if (self.path is None) == (self.hf_config is None):
            raise field_error("HFConfig", "path", "give exactly one of path (a pretrained model) and hf_config", self.path)
        for name in ("path", "tokenizer_path"):
            value = getattr(self, name)
            problem = None if value is None else root_path_problem(value, "model root")
            if problem is not None:
                raise field_error("HFConfig", name, problem, value)
        if self.hf_config is not None:
            _check_hf_config(self.hf_config)
        if self.task == "sequence_classification" and self.num_labels is None:
            raise field_error("HFConfig", "num_labels", "task 'sequence_classification' needs num_labels (>= 2)", None)
        if self.task == "causal_lm" and self.num_labels is not None:
            raise field_error("HFConfig", "num_labels", "num_labels is only used with task 'sequence_classification'",
                              self.num_labels)
        return self

    @property
    def byte_level(self) -> bool:
        """True when the model has no tokenizer: an ``hf_config`` without ``tokenizer_path``."""
        return self.path is None and self.tokenizer_path is None


def _check_hf_config(config: dict[str, Any]) -> None:
    """``hf_config`` names a ``model_type``, stays small and bounded, and asks for no remote code."""
    try:
        size = len(json.dumps(config))
    except (TypeError, ValueError):
        raise field_error("HFConfig", "hf_config", "hf_config must be plain JSON data", None) from None
    if size > MAX_HF_CONFIG_BYTES:
        raise field_error("HFConfig", "hf_config", f"hf_config is {size} bytes of JSON (at most {MAX_HF_CONFIG_BYTES})", None)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type.isidentifier():
        raise field_error("HFConfig", "hf_config", "hf_config needs a model_type (e.g. 'llama')", model_type)
    forbidden = sorted(HF_CONFIG_FORBIDDEN & config.keys())
    if forbidden:
        raise field_error("HFConfig", "hf_config", f"hf_config may not set {forbidden} (no remote code)", forbidden)
    for key, limit in HF_CONFIG_LIMITS.items():
        value = config.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit):
            raise field_error("HFConfig", "hf_config", f"hf_config {key} must be an integer in [1, {limit}]", value)


class HFModel(_Strict):
    name: Literal["hf"]
    config: HFConfig


ModelSpec = Annotated[MLPModel | GPTModel | HFModel, Field(discriminator="name")]

# ----------------------------------------------------------------------------- datasets


class DigitsConfig(_Strict):
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes)."""

    test_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.2
    #: scikit-learn's ``random_state`` takes 0..2**32-1.
    split_seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0


class DigitsDataset(_Strict):
    name: Literal["digits"]
    config: DigitsConfig = DigitsConfig()


class TextConfig(_Strict):
    """Byte-level language modelling over real text.

    ``source`` is ``"python-stdlib"`` (the worker's own Python standard library
    sources) or ``"file"`` with ``path`` relative to one of the worker's data roots.
    """

    source: Literal["python-stdlib", "file"] = "python-stdlib"
    path: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    seq_len: Annotated[int, Field(ge=2, le=8192)] = 128
    max_bytes: Annotated[int, Field(ge=1024, le=1 << 31)] = 4 << 20
    test_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.05

    @model_validator(mode="after")
    def _path_matches_source(self) -> Self:
        if self.source == "file" and self.path is None:
            raise field_error("TextConfig", "path", "source 'file' needs a path under a data root", None)
        if self.source == "python-stdlib" and self.path is not None:
            raise field_error("TextConfig", "path", "path is only used with source 'file'", self.path)
        problem = None if self.path is None else root_path_problem(self.path, "data root")
        if problem is not None:
            raise field_error("TextConfig", "path", problem, self.path)
        return self


class TextDataset(_Strict):
    name: Literal["text"]
    config: TextConfig = TextConfig()


class SyntheticConfig(_Strict):
    """Seeded random data for tests: regression ``y = x @ w * target_scale`` or classification."""

    task: Literal["regression", "classification"] = "regression"
    num_samples: Annotated[int, Field(ge=1, le=10_000_000)] = 1024
    in_features: Annotated[int, Field(ge=1, le=65536)] = 16
    out_features: Annotated[int, Field(ge=1, le=65536)] = 1
    num_classes: Annotated[int, Field(ge=2, le=65536)] = 10
    target_scale: Annotated[float, Field(gt=0.0, le=1e6)] = 1.0
    noise: Annotated[float, Field(ge=0.0, le=1e3)] = 0.0
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0


class SyntheticDataset(_Strict):
    name: Literal["synthetic"]
    config: SyntheticConfig = SyntheticConfig()


DatasetSpec = Annotated[DigitsDataset | TextDataset | SyntheticDataset, Field(discriminator="name")]

#: Which model families can consume which dataset task.
MODEL_DATASETS: dict[str, frozenset[str]] = {
    "mlp": frozenset({"digits", "synthetic"}),
    "gpt": frozenset({"text"}),
    # ``jsonl`` (JSON-lines / CSV files, tokenized) belongs to the file-datasets work; only its name is needed here.
    "hf": frozenset({"text", "jsonl"}),
}
