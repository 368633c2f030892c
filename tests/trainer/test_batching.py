"""Batch planning and accumulation windows."""

from __future__ import annotations

import pytest

from halfcast.contracts.spec import JobSpec
from trainer.batching import plan_batches, windows

BASE = {"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}}


def test_plan_from_accumulation_or_global_batch() -> None:
    given = plan_batches(JobSpec.model_validate({**BASE, "micro_batch_size": 8, "gradient_accumulation_steps": 3}))
    assert (given.accumulation_steps, given.global_batch_size) == (3, 24)
    fields = {**BASE, "micro_batch_size": 8, "processes": 2, "global_batch_size": 64}
    derived = plan_batches(JobSpec.model_validate(fields))
    assert (derived.micro_batch_size, derived.accumulation_steps, derived.world_size) == (8, 4, 2)
    assert derived.global_batch_size == 64


def test_windows_keep_a_short_last_window() -> None:
    assert list(windows(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(windows(range(6), 3)) == [[0, 1, 2], [3, 4, 5]]
    assert list(windows([], 2)) == []
    with pytest.raises(ValueError):
        list(windows(range(3), 0))
