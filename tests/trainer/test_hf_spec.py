"""The hf model and adapter blocks of the job spec: 422s located at the field, torch-free validation."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from hf_support import TINY_LLAMA, lora_spec
from pydantic import ValidationError

from halfcast.contracts.catalog import HFConfig
from halfcast.contracts.spec import JobSpec


def _locs(fields: dict[str, Any]) -> list[tuple[Any, ...]]:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(fields)
    return [tuple(e["loc"]) for e in info.value.errors()]


def test_a_lora_job_validates_with_defaults() -> None:
    spec = JobSpec.model_validate(lora_spec(precision="bf16"))
    assert spec.adapter is not None and spec.adapter.r == 4 and spec.effective_base_dtype == "compute"
    assert JobSpec.model_validate(lora_spec()).effective_base_dtype == "fp32"  # fp32: compute is fp32
    assert JobSpec.model_validate(lora_spec(adapter=None)).effective_base_dtype is None
    assert JobSpec.model_validate(lora_spec(processes=2, parallelism="fsdp")).parallelism == "fsdp"
    assert JobSpec.model_validate(lora_spec(precision="fp8", gpus=1)).effective_base_dtype == "compute"
    scratch = lora_spec(model={"name": "hf", "config": {"hf_config": TINY_LLAMA}})
    config = JobSpec.model_validate(scratch).model.config
    assert isinstance(config, HFConfig) and config.byte_level


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"model": {"name": "mlp"}, "dataset": {"name": "digits"}}, ("adapter",)),
        ({"model": {"name": "hf", "config": {}}}, ("model", "hf", "config", "path")),
        (
            {"model": {"name": "hf", "config": {"path": "x", "hf_config": TINY_LLAMA}}},
            ("model", "hf", "config", "path"),
        ),
        ({"model": {"name": "hf", "config": {"path": "/abs/llama"}}}, ("model", "hf", "config", "path")),
        ({"model": {"name": "hf", "config": {"path": "a/../../etc"}}}, ("model", "hf", "config", "path")),
        (
            {"model": {"name": "hf", "config": {"path": "llama", "tokenizer_path": "../t"}}},
            ("model", "hf", "config", "tokenizer_path"),
        ),
        (
            {"model": {"name": "hf", "config": {"path": "llama", "task": "sequence_classification"}}},
            ("model", "hf", "config", "num_labels"),
        ),
        (
            {"model": {"name": "hf", "config": {"path": "llama", "task": "sequence_classification", "num_labels": 3}}},
            ("dataset",),
        ),
        ({"model": {"name": "hf", "config": {"path": "llama", "tokenizer_path": "tok"}}}, ("dataset",)),
        (
            {"model": {"name": "hf", "config": {"hf_config": {"hidden_size": 16}}}},
            ("model", "hf", "config", "hf_config"),
        ),
        (
            {"model": {"name": "hf", "config": {"hf_config": {**TINY_LLAMA, "auto_map": {}}}}},
            ("model", "hf", "config", "hf_config"),
        ),
        (
            {"model": {"name": "hf", "config": {"hf_config": {**TINY_LLAMA, "hidden_size": 1 << 20}}}},
            ("model", "hf", "config", "hf_config"),
        ),
        ({"adapter": {"target_modules": []}}, ("adapter", "target_modules")),
        ({"adapter": {"target_modules": "everything"}}, ("adapter", "target_modules")),
        ({"adapter": {"r": 0}}, ("adapter", "r")),
        ({"adapter": {"type": "ia3"}}, ("adapter", "type")),
    ],
)
def test_impossible_combinations_are_422_at_the_field(change: dict[str, Any], loc: tuple[Any, ...]) -> None:
    assert loc in [found[: len(loc)] for found in _locs(lora_spec(**change))]


def test_validating_a_spec_imports_neither_torch_nor_transformers() -> None:
    code = (
        f"import sys, halfcast.contracts.spec as s; s.JobSpec.model_validate({lora_spec()!r}); "
        "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
