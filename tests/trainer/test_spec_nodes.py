"""The spec's ``nodes`` and ``distributed`` (issue 16): world size over nodes, bounds, 422 locations."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from halfcast.contracts.spec import MAX_RANKS, JobSpec

BASE: dict[str, Any] = {"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}}


def locations(spec: dict[str, Any]) -> list[tuple[Any, ...]]:
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate({**BASE, **spec})
    return [error["loc"] for error in caught.value.errors()]


def test_world_size_spans_the_nodes_and_ranks_per_node_is_torchruns_nproc() -> None:
    spec = JobSpec.model_validate({**BASE, "nodes": 2, "processes": 2})

    assert (spec.world_size, spec.ranks_per_node, spec.nodes) == (4, 2, 2)
    assert JobSpec.model_validate(BASE).nodes == 1 and JobSpec.model_validate(BASE).distributed is None


def test_the_batch_check_counts_every_node() -> None:
    assert locations({"nodes": 2, "processes": 2, "micro_batch_size": 4, "global_batch_size": 24}) == [
        ("global_batch_size",)
    ]
    JobSpec.model_validate({**BASE, "nodes": 2, "processes": 2, "micro_batch_size": 4, "global_batch_size": 32})


def test_the_distributed_defaults() -> None:
    spec = JobSpec.model_validate({**BASE, "nodes": 2})

    assert spec.effective_distributed.timeout_s == 300.0 and spec.effective_distributed.gang_timeout_s == 600.0


@pytest.mark.parametrize(
    ("spec", "loc"),
    [
        ({"nodes": 0}, ("nodes",)),
        ({"nodes": 65}, ("nodes",)),
        ({"nodes": 5, "processes": 256}, ("nodes",)),  # 1280 ranks > MAX_RANKS
        ({"nodes": 2, "distributed": {"timeout_s": 0}}, ("distributed", "timeout_s")),
        ({"nodes": 2, "distributed": {"gang_timeout_s": -1}}, ("distributed", "gang_timeout_s")),
        ({"nodes": 2, "distributed": {"bogus": 1}}, ("distributed", "bogus")),
        ({"distributed": {"gang_timeout_s": 30}}, ("distributed", "gang_timeout_s")),  # no gang on one node
    ],
)
def test_bad_values_name_their_field(spec: dict[str, Any], loc: tuple[Any, ...]) -> None:
    assert locations(spec) == [loc]


def test_one_node_may_still_set_the_process_group_timeout() -> None:
    spec = JobSpec.model_validate({**BASE, "processes": 2, "distributed": {"timeout_s": 20}})

    assert spec.effective_distributed.timeout_s == 20 and MAX_RANKS == 4 * 256
