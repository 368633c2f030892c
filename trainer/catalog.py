"""Torch-free catalogue of the models and datasets a job spec may name.

Each entry is a pydantic model ``{"name": <literal>, "config": <typed config>}``;
:mod:`trainer.spec` joins them into discriminated unions, so an unknown name or a
bad config value is a validation error that names the field (HTTP 422 in the API).
The torch code that builds each entry lives in :mod:`trainer.models` and
:mod:`trainer.data`; this module must never import torch.
"""

from __future__ import annotations

from typing import Annotated, Literal

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError


class _Strict(BaseModel):
    """Base for every spec block: unknown fields are rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def field_error(model: str, field: str, message: str, value: object) -> ValidationError:
    """A ``ValidationError`` located at ``field`` (so the API's 422 names it)."""
    detail = InitErrorDetails(type=PydanticCustomError("value_error", message), loc=(field,), input=value)
    return ValidationError.from_exception_data(model, [detail])


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


ModelSpec = Annotated[MLPModel | GPTModel, Field(discriminator="name")]

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
        if self.path is not None and not self.path.isprintable():
            raise field_error("TextConfig", "path", "path must be printable text (no control characters or NUL)", self.path)
        if self.source == "file" and self.path is None:
            raise field_error("TextConfig", "path", "source 'file' needs a path under a data root", None)
        if self.source == "python-stdlib" and self.path is not None:
            raise field_error("TextConfig", "path", "path is only used with source 'file'", self.path)
        if self.path is not None and (self.path.startswith(("/", "\\")) or ".." in self.path.replace("\\", "/").split("/")):
            msg = "path must be relative to a data root, without '..'"
            raise field_error("TextConfig", "path", msg, self.path)
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
}
