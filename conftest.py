"""Repository-wide pytest hooks (fixtures live in tests/conftest.py).

Tests marked ``gpu`` are skipped when CUDA is not available, so the suite passes on
CPU-only machines and in CI. ``HALFCAST_REQUIRE_GPU=1`` never skips them, for runs on
a GPU host where a skipped GPU test would hide a broken CUDA setup.
"""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items or os.environ.get("HALFCAST_REQUIRE_GPU") == "1":
        return  # (no torch import for a run without GPU tests)
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in gpu_items:
            item.add_marker(skip)
