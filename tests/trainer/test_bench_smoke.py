"""Smoke tests of ``bench.compare_peers`` (issue 3) and ``bench.lora_peers`` (issue 12 item 8).

Checks the result's structure and the headline property: Halfcast's steady-state fp16
step makes no host sync (its one batched copy is in the flush), while the hand-written
GradScaler loop that keeps the LR schedule still on skipped steps makes at least one.
"""

from __future__ import annotations

import math

import pytest

from bench.compare_peers import run_benchmark
from bench.report import markdown_table
from bench.workload import Workload

pytestmark = pytest.mark.slow  # imports transformers and peft, spawns interpreters: not in make check

TINY = Workload(
    precision="fp16",
    in_features=16,
    hidden_sizes=(32,),
    micro_batch_size=8,
    num_batches=4,
    log_interval=3,
    total_steps=50,
)


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


def test_host_overhead_checks_its_precisions_when_parsing() -> None:
    """``--precisions`` becomes the workloads' precision names; an unknown one is a usage error, not a late failure."""
    from bench.host_overhead import parse_args

    assert parse_args([]).precisions == ["fp32", "bf16", "fp16"]
    assert parse_args(["--precisions", "fp16,,bf16"]).precisions == ["fp16", "bf16"]
    with pytest.raises(SystemExit):
        parse_args(["--precisions", "fp16,fp8"])


@pytest.mark.slow  # imports transformers/peft and builds four paths: ~25 s on a loaded 2-core VM
def test_lora_peers_smoke() -> None:
    """``bench.lora_peers``: a 1-round, 2-step run of every LoRA path; schema and "every path ran" only.

    About 30 s alone, up to 90 s beside other workers: it imports transformers and peft and builds each
    path's model (hand loop, Halfcast, the peers), the cost the benchmark itself pays once per path.
    """
    from bench.lora_peers import run_lora_benchmark
    from bench.lora_workload import LoraWorkload

    work = LoraWorkload(
        precision="bf16",
        hidden_size=16,
        intermediate_size=32,
        num_layers=1,
        num_heads=2,
        vocab_size=300,
        seq_len=16,
        micro_batch_size=2,
        num_batches=2,
        total_steps=40,
        log_interval=2,
    )
    names = ["hand", "halfcast", "trainer", "halfcast-compute"]
    result = run_lora_benchmark(work, names, steps=2, rounds=1, warmup=1, sync_steps=2)
    peers = result["peers"]
    assert list(peers) == names and result["reference"] == "hand"
    assert set(result["load_average"]) == {"before", "after"}
    for peer in peers.values():
        assert peer["status"] == "ok", peer
        assert len(peer["seconds_per_step"]) == 1 and math.isfinite(peer["median_ms"]) and peer["median_ms"] > 0
        assert peer["info"]["compute_dtype"] == "bfloat16"
        assert len(peer["syncs_per_step"]) == 2
    assert peers["halfcast"]["steady_syncs"] == 0
    assert "HF Trainer" in markdown_table(peers)


@pytest.mark.slow  # a fresh interpreter importing transformers
def test_lora_memory_in_subprocess() -> None:
    """The per-path peak-memory child process returns a positive peak and how it was measured."""
    from bench.lora_memory import measure_in_subprocess
    from bench.lora_workload import LoraWorkload

    work = LoraWorkload(
        precision="fp32",
        hidden_size=16,
        intermediate_size=32,
        num_layers=1,
        num_heads=2,
        vocab_size=300,
        seq_len=16,
        micro_batch_size=2,
        num_batches=2,
        total_steps=40,
    )
    memory = measure_in_subprocess("hand", work, steps=2, threads=1)
    assert memory.get("peak_mib", 0) > 0 and memory["method"], memory
