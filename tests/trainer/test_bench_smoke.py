"""Smoke test of ``bench.compare_peers``: a tiny run of the hand loop and Halfcast (issue 3).

Checks the result's structure and the headline property: Halfcast's steady-state fp16
step makes no host sync (its one batched copy is in the flush), while the hand-written
GradScaler loop that keeps the LR schedule still on skipped steps makes at least one.
"""

from __future__ import annotations

import math

from bench.compare_peers import run_benchmark
from bench.report import markdown_table
from bench.workload import Workload

TINY = Workload(precision="fp16", in_features=16, hidden_sizes=(32,), micro_batch_size=8, num_batches=4,
                log_interval=3, total_steps=50)


def test_hand_loop_and_halfcast_smoke() -> None:
    result = run_benchmark(TINY, ["hand", "halfcast"], steps=3, rounds=1, warmup=2, sync_steps=3)
    peers = result["peers"]
    assert list(peers) == ["hand", "halfcast"] and result["reference"] == "hand"
    for peer in peers.values():
        assert peer["status"] == "ok"
        assert len(peer["seconds_per_step"]) == 1 and math.isfinite(peer["median_ms"]) and peer["median_ms"] > 0
        assert peer["info"]["compute_dtype"] == "float16"
        assert len(peer["syncs_per_step"]) == 3
    assert peers["hand"]["ratio"] == 1.0
    assert peers["halfcast"]["steady_syncs"] == 0
    assert peers["hand"]["steady_syncs"] >= 1
    assert peers["halfcast"]["syncs_per_flush"] == [1]  # 3 counted steps, log interval 3: one flush, one copy
    assert "Halfcast" in markdown_table(peers)
