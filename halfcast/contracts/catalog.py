"""Torch-free catalogue of the models and datasets a job spec may name.

Each entry is a pydantic model ``{"name": <literal>, "config": <typed config>}``;
:mod:`halfcast.contracts.spec` joins them into discriminated unions, so an unknown name or a
bad config value is a validation error that names the field (HTTP 422 in the API).
The torch code that builds each entry lives in :mod:`trainer.models` and
:mod:`trainer.data`; this module must never import torch.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError


class _Strict(BaseModel):
    """Base for every spec block: unknown fields are rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def field_error(model: str, field: str | tuple[str, ...], message: str, value: object) -> ValidationError:
    """A ``ValidationError`` located at ``field`` (a name, or a path of names) so the API's 422 names it."""
    loc = (field,) if isinstance(field, str) else field
    detail = InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=value)
    return ValidationError.from_exception_data(model, [detail])


def root_path_problem(path: str, root: str) -> str | None:
    """Why ``path`` cannot name something under a ``root`` (not printable, absolute, ``..``), or ``None``."""
    if not path.isprintable():
        return "path must be printable text (no control characters or NUL)"
    if path.startswith(("/", "\\")) or ".." in path.replace("\\", "/").split("/"):
        return f"path must be relative to a {root}, without '..'"
    return None


def check_data_path(model: str, path: str) -> None:
    """Reject a dataset ``path`` that is not printable or not relative to a data root (``..``, leading slash).

    The trainer checks again where the path really leads (:mod:`trainer.data.sources`).
    """
    if (problem := root_path_problem(path, "data root")) is not None:
        raise field_error(model, "path", problem, path)


#: The id of a registered dataset or model (``POST /datasets``, ``POST /models``): a lowercase UUID.
REGISTRY_ID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
RegistryId = Annotated[str, Field(pattern=REGISTRY_ID_PATTERN, min_length=36, max_length=36)]
#: A SHA-256 digest as 64 lowercase hex digits.
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", min_length=64, max_length=64)]

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
    "hidden_size": 16384,
    "intermediate_size": 65536,
    "num_hidden_layers": 256,
    "num_attention_heads": 256,
    "num_key_value_heads": 256,
    "vocab_size": 1 << 20,
    "max_position_embeddings": 1 << 20,
    "head_dim": 1024,
}
#: ``hf_config`` keys that would make Hugging Face run code from elsewhere.
HF_CONFIG_FORBIDDEN = frozenset({"auto_map", "trust_remote_code", "_name_or_path", "name_or_path"})


class HFConfig(_Strict):
    """A Hugging Face transformers model: a local pretrained directory (``path``, relative to one of the
    worker's model roots, safetensors weights only), a registered model (``model_id``, uploaded with
    ``POST /models`` or registered from a job's export) or a from-scratch ``hf_config`` (random init).

    ``task``: ``causal_lm`` (logits ``[B, T, V]``) or ``sequence_classification`` (``num_labels``
    classes, logits ``[B, num_labels]``). ``tokenizer_path``: a tokenizer directory under a model
    root (default: ``path`` itself; an ``hf_config`` model without one is byte-level, vocabulary 256).
    """

    path: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    model_id: RegistryId | None = None
    hf_config: dict[str, object] | None = None
    task: Literal["causal_lm", "sequence_classification"] = "causal_lm"
    num_labels: Annotated[int, Field(ge=2, le=65536)] | None = None
    tokenizer_path: Annotated[str, Field(min_length=1, max_length=1024)] | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if sum(value is not None for value in (self.path, self.model_id, self.hf_config)) != 1:
            msg = "give exactly one of path (a pretrained model under a model root), model_id (a registered model) and hf_config"
            raise field_error("HFConfig", "path", msg, self.path)
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
            raise field_error(
                "HFConfig", "num_labels", "num_labels is only used with task 'sequence_classification'", self.num_labels
            )
        return self

    @property
    def byte_level(self) -> bool:
        """True when the model has no tokenizer: an ``hf_config`` without ``tokenizer_path``."""
        return self.hf_config is not None and self.tokenizer_path is None


def _check_hf_config(config: dict[str, object]) -> None:
    """``hf_config`` names a ``model_type``, stays small and bounded, and asks for no remote code."""
    try:
        size = len(json.dumps(config))
    except (TypeError, ValueError):
        raise field_error("HFConfig", "hf_config", "hf_config must be plain JSON data", None) from None
    if size > MAX_HF_CONFIG_BYTES:
        raise field_error(
            "HFConfig", "hf_config", f"hf_config is {size} bytes of JSON (at most {MAX_HF_CONFIG_BYTES})", None
        )
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
        if self.path is not None:
            check_data_path("TextConfig", self.path)
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


JsonlFormat = Literal["text", "instruction", "chat", "classification"]
Masking = Literal["assistant", "last", "output", "none"]
FileFormat = Literal["jsonl", "csv"]

#: The fields each ``jsonl`` format reads from a row (``column_map`` renames file fields to these).
FORMAT_FIELDS: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "instruction": ("instruction", "input", "output"),
    "chat": ("messages",),
    "classification": ("text", "label"),
}
#: The masking modes each format allows, its default first (classification has no token masking).
FORMAT_MASKING: dict[str, tuple[str, ...]] = {
    "text": ("none",),
    "instruction": ("output", "none"),
    "chat": ("assistant", "last", "none"),
    "classification": (),
}
#: File extension -> file format, when ``file_format`` is not given.
FILE_EXTENSIONS: dict[str, str] = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv"}

_ColumnName = Annotated[str, Field(min_length=1, max_length=256)]


class JsonlConfig(_Strict):
    """Rows of a JSON-lines or CSV file, tokenized with the model's tokenizer: a file under a data root
    (``path``) or a registered dataset (``dataset_id``, uploaded with ``POST /datasets``).

    With a ``dataset_id``, ``format`` and ``file_format`` default to the registered dataset's (the
    API checks given ones against it), ``column_map`` is refused, and the worker fills in
    ``format``, ``file_format`` and ``sha256`` before the run (:mod:`trainer.registered`);
    ``sha256``, given or filled in, is checked by the trainer before it reads a row.

    ``format``: ``text`` (field ``text``), ``instruction`` (``instruction``, optional
    ``input``, ``output``), ``chat`` (``messages``: ``[{role, content}]``, JSON lines only)
    or ``classification`` (``text``, ``label``). ``column_map`` renames file fields to
    those (``{"prompt": "instruction"}``). ``masking`` picks the trained tokens (default:
    the format's first in :data:`FORMAT_MASKING`). ``file_format`` defaults from the
    path's extension (:data:`FILE_EXTENSIONS`). ``max_seq_len`` is the model's input
    length: a language-modelling example keeps ``max_seq_len + 1`` tokens (inputs and
    shifted targets of ``max_seq_len``), a classification example ``max_seq_len``.
    """

    path: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    dataset_id: RegistryId | None = None
    sha256: Sha256 | None = None
    format: JsonlFormat | None = None
    file_format: FileFormat | None = None
    column_map: Annotated[dict[_ColumnName, _ColumnName], Field(max_length=16)] = {}
    masking: Masking | None = None
    max_seq_len: Annotated[int, Field(ge=2, le=131072)] = 512
    max_bytes: Annotated[int, Field(ge=1, le=1 << 34)] = 1 << 30
    test_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.05
    split_seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0

    @model_validator(mode="after")
    def _check_fields(self) -> Self:
        self._check_source()
        if self.format == "chat" and self.known_file_format not in (None, "jsonl"):
            raise field_error("JsonlConfig", "file_format", "format 'chat' reads JSON lines, not CSV", self.file_format)
        if self.format is not None:
            self._check_masking()
            self._check_column_map()
        return self

    def _check_source(self) -> None:
        """Exactly one of ``path`` and ``dataset_id``; a ``path`` needs a ``format`` and a known file format."""
        if (self.path is None) == (self.dataset_id is None):
            msg = "give exactly one of path (a file under a data root) and dataset_id (a registered dataset)"
            raise field_error("JsonlConfig", "path", msg, self.path)
        if self.dataset_id is not None:
            if self.column_map:
                msg = (
                    "column_map renames a file's columns; a registered dataset's rows already have the format's fields"
                )
                raise field_error("JsonlConfig", "column_map", msg, self.column_map)
            return
        assert self.path is not None
        check_data_path("JsonlConfig", self.path)
        if self.format is None:
            raise field_error(
                "JsonlConfig",
                "format",
                "format is required with a path (text, instruction, chat or classification)",
                None,
            )
        if self.file_format is None and self._extension not in FILE_EXTENSIONS:
            msg = f"cannot tell the file format from {self.path!r}: name it .jsonl, .json or .csv, or set file_format"
            raise field_error("JsonlConfig", "file_format", msg, None)

    def _check_masking(self) -> None:
        assert self.format is not None
        allowed = FORMAT_MASKING[self.format]
        if self.masking is not None and self.masking not in allowed:
            modes = f"it takes: {', '.join(allowed)}" if allowed else "it has no token masking: leave masking unset"
            msg = f"masking '{self.masking}' does not apply to format '{self.format}' ({modes})"
            raise field_error("JsonlConfig", "masking", msg, self.masking)

    def _check_column_map(self) -> None:
        assert self.format is not None
        fields = FORMAT_FIELDS[self.format]
        for source, target in self.column_map.items():
            if not (source.isprintable() and target.isprintable()):
                raise field_error("JsonlConfig", "column_map", "column names must be printable text", source)
            if target not in fields:
                msg = f"column_map target {target!r} is not a field of format '{self.format}' ({', '.join(fields)})"
                raise field_error("JsonlConfig", "column_map", msg, target)
        if len(set(self.column_map.values())) < len(self.column_map):
            raise field_error("JsonlConfig", "column_map", "two columns map to the same field", self.column_map)

    @property
    def _extension(self) -> str:
        if self.path is None:
            return ""
        name = self.path.replace("\\", "/").rsplit("/", 1)[-1].lower()
        return name[name.rfind(".") :] if "." in name else ""

    @property
    def known_file_format(self) -> str | None:
        """``file_format``, or the one the path's extension names; ``None`` for a ``dataset_id`` not resolved yet."""
        return self.file_format or FILE_EXTENSIONS.get(self._extension)

    @property
    def effective_file_format(self) -> str:
        """``file_format``, or the one the path's extension names (``ValueError`` for an unresolved ``dataset_id``)."""
        known = self.known_file_format
        if known is None:
            raise ValueError(f"the file format of dataset {self.dataset_id} is not resolved yet")
        return known

    @property
    def resolved(self) -> bool:
        """Whether everything the trainer needs is known: always for a ``path``; for a ``dataset_id``, its
        ``format``, ``file_format`` and ``sha256``, which the worker fills in from the registry."""
        return self.path is not None or None not in (self.format, self.file_format, self.sha256)

    @property
    def source(self) -> str:
        """How errors name the data: the ``path``, or ``dataset <id>``."""
        return self.path if self.path is not None else f"dataset {self.dataset_id}"

    @property
    def effective_masking(self) -> str | None:
        """``masking``, or the format's default (``None`` for classification or a format not resolved yet)."""
        if self.format is None:
            return self.masking
        allowed = FORMAT_MASKING[self.format]
        return self.masking or (allowed[0] if allowed else None)


class JsonlDataset(_Strict):
    name: Literal["jsonl"]
    config: JsonlConfig


DatasetSpec = Annotated[DigitsDataset | TextDataset | SyntheticDataset | JsonlDataset, Field(discriminator="name")]

#: Which model families can consume which dataset task.
MODEL_DATASETS: dict[str, frozenset[str]] = {
    "mlp": frozenset({"digits", "synthetic"}),
    "gpt": frozenset({"text"}),
    # ``jsonl`` (JSON-lines / CSV files, tokenized) belongs to the file-datasets work; only its name is needed here.
    "hf": frozenset({"text", "jsonl"}),
}


#: The evaluation metrics each dataset task reports (``loss`` always): see :mod:`trainer.run.evaluate`.
TASK_METRICS: dict[str, frozenset[str]] = {
    "classification": frozenset({"loss", "accuracy"}),
    "regression": frozenset({"loss"}),
    "lm": frozenset({"loss", "perplexity"}),
}


def dataset_task(dataset: DigitsDataset | TextDataset | SyntheticDataset | JsonlDataset) -> str | None:
    """The task a dataset trains: ``classification``, ``regression`` or ``lm`` (keys of :data:`TASK_METRICS`);
    ``None`` for a registered ``jsonl`` dataset whose format is not resolved yet (the API and the worker
    validate the spec again once they have filled it in)."""
    if isinstance(dataset, DigitsDataset):
        return "classification"
    if isinstance(dataset, SyntheticDataset):
        return dataset.config.task
    if isinstance(dataset, JsonlDataset) and dataset.config.format is None:
        return None
    if isinstance(dataset, JsonlDataset) and dataset.config.format == "classification":
        return "classification"
    return "lm"
