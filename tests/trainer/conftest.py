"""Fixtures for trainer tests: one CPU thread, a single-rank CPU context, small job specs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from halfcast.contracts.spec import JobSpec
from trainer.parallel.distributed import DistContext


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """The test machine is shared: keep torch to one intra-op thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def cpu_ctx() -> DistContext:
    """Rank 0 of a world of one, on the CPU, without a process group."""
    return DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


SpecFactory = Callable[..., JobSpec]


@pytest.fixture
def tiny_mlp_spec() -> SpecFactory:
    """``tiny_mlp_spec(**overrides)``: the field cases' "tiny MLP", Linear(16->32)-ReLU-Linear(32->1),
    on seeded synthetic regression, 4 steps of micro-batch 16; top-level spec fields override."""
    return _tiny_mlp_spec


def _tiny_mlp_spec(**overrides: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "model": {"name": "mlp", "config": {"hidden_sizes": [32]}},
        "dataset": {"name": "synthetic", "config": {"in_features": 16, "num_samples": 256, "seed": 3}},
        "micro_batch_size": 16,
        "max_steps": 4,
        "seed": 0,
    }
    fields.update(overrides)
    return JobSpec.model_validate(fields)


@pytest.fixture(scope="session")
def hf_model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model root with the tiny Hugging Face models of :mod:`hf_support`, built once per session."""
    from hf_support import build_model_root

    return build_model_root(tmp_path_factory.mktemp("model-root"))


@pytest.fixture
def model_roots(hf_model_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``HALFCAST_MODEL_ROOTS`` set to :func:`hf_model_root` for the test; returns the root."""
    monkeypatch.setenv("HALFCAST_MODEL_ROOTS", str(hf_model_root))
    return hf_model_root
