"""The job spec: defaults, derived batch sizes, and validation errors that name the field."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from halfcast.contracts.spec import JobSpec

BASE: dict[str, Any] = {"model": {"name": "mlp"}, "dataset": {"name": "digits"}}


def _locs(spec: dict[str, Any]) -> list[tuple[Any, ...]]:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(spec)
    return [tuple(error["loc"]) for error in info.value.errors()]


def test_importing_the_spec_does_not_import_torch() -> None:
    code = "import sys, halfcast.contracts.spec, halfcast.contracts.catalog; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_defaults_and_derived_values() -> None:
    spec = JobSpec.model_validate(BASE | {"precision": "fp16"})
    assert spec.world_size == 1 and spec.accumulation_steps == 1
    assert spec.effective_loss_scale is not None and spec.effective_loss_scale.init_scale == 65536.0
    assert JobSpec.model_validate(BASE).effective_loss_scale is None


def test_accumulation_is_derived_from_global_batch() -> None:
    spec = JobSpec.model_validate(BASE | {"global_batch_size": 256, "micro_batch_size": 32, "processes": 2})
    assert spec.accumulation_steps == 4 and spec.effective_global_batch_size == 256
    gpu = JobSpec.model_validate(BASE | {"global_batch_size": 64, "micro_batch_size": 8, "gpus": 4})
    assert gpu.world_size == 4 and gpu.accumulation_steps == 2


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"bogus": 1}, ("bogus",)),
        ({"model": {"name": "resnet"}}, ("model",)),
        ({"dataset": {"name": "imagenet"}}, ("dataset",)),
        ({"model": {"name": "mlp", "config": {"hidden": [3]}}}, ("model", "mlp", "config", "hidden")),
        ({"global_batch_size": 100, "micro_batch_size": 32}, ("global_batch_size",)),
        (
            {"global_batch_size": 64, "micro_batch_size": 32, "gradient_accumulation_steps": 3},
            ("gradient_accumulation_steps",),
        ),
        ({"max_steps": -1}, ("max_steps",)),
        ({"max_steps": 10**12}, ("max_steps",)),
        ({"micro_batch_size": 0}, ("micro_batch_size",)),
        ({"precision": "fp64"}, ("precision",)),
        ({"precision": "bf16", "loss_scale": {}}, ("loss_scale",)),
        ({"precision": "fp8"}, ("precision",)),
        ({"precision": "fp16", "loss_scale": {"init_scale": 1e9}}, ("loss_scale", "init_scale")),
        (
            {"precision": "fp16", "loss_scale": {"min_scale": 8, "max_scale": 4, "init_scale": 4}},
            ("loss_scale", "min_scale"),
        ),
        ({"precision": "fp16", "loss_scale": {"growth_factor": 1.0}}, ("loss_scale", "growth_factor")),
        ({"precision": "fp16", "loss_scale": {"backoff_factor": 1.5}}, ("loss_scale", "backoff_factor")),
        ({"precision": "fp16", "loss_scale": {"static_scale": 8.0}}, ("loss_scale", "static_scale")),
        ({"precision": "fp16", "loss_scale": {"init_scale": "inf"}}, ("loss_scale", "init_scale")),
        ({"model": {"name": "gpt"}}, ("dataset",)),
        ({"gpus": 2, "processes": 3}, ("processes",)),
        ({"optimizer": {"name": "adamw", "lr": -1}}, ("optimizer", "lr")),
        ({"name": "bad\x00name"}, ("name",)),
        (
            {"model": {"name": "gpt", "config": {"d_model": 100, "n_head": 3}}, "dataset": {"name": "text"}},
            ("model", "gpt", "config", "d_model"),
        ),
        (
            {"model": {"name": "gpt"}, "dataset": {"name": "text", "config": {"source": "file"}}},
            ("dataset", "text", "config", "path"),
        ),
        (
            {
                "model": {"name": "gpt"},
                "dataset": {"name": "text", "config": {"source": "file", "path": "/etc/passwd"}},
            },
            ("dataset", "text", "config", "path"),
        ),
        (
            {"model": {"name": "gpt"}, "dataset": {"name": "text", "config": {"source": "file", "path": "a/../../x"}}},
            ("dataset", "text", "config", "path"),
        ),
    ],
)
def test_bad_input_names_the_field(change: dict[str, Any], loc: tuple[Any, ...]) -> None:
    assert loc in _locs(BASE | change)


def test_static_mode_uses_static_scale_or_init_scale() -> None:
    ls = {"mode": "static", "init_scale": 512.0}
    loss_scale = JobSpec.model_validate(BASE | {"precision": "fp16", "loss_scale": ls}).effective_loss_scale
    assert loss_scale is not None and loss_scale.effective_static_scale == 512.0
