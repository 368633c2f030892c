"""Two gloo ranks train an hf LoRA job under DDP: frozen base weights are ignored, scales and adapters agree."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hf_support import lora_spec
from trainer.loop import train
from trainer.records import read_records
from trainer.spec import JobSpec
from trainer_support import free_port, init_gloo


def _rank(rank: int, port: int, out: str, root: str) -> None:
    os.environ["HALFCAST_MODEL_ROOTS"] = root
    ctx = init_gloo(rank, port)
    try:
        spec = JobSpec.model_validate(lora_spec(
            precision="fp16", loss_scale={"init_scale": 1024}, processes=2, gradient_accumulation_steps=2,
            max_steps=4, micro_batch_size=2, faults={"nonfinite_grad_steps": [2], "ranks": [1]}))
        result = train(spec, Path(out) / "run", ctx)
        params = {n: p.detach().clone() for n, p in result.model.named_parameters() if p.requires_grad}
        torch.save({"params": params}, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_rank_ddp_lora_job_keeps_ranks_identical(hf_model_root: Path, tmp_path: Path) -> None:
    mp.start_processes(_rank, args=(free_port(), str(tmp_path), str(hf_model_root)), nprocs=2, start_method="spawn")
    ranks: list[dict[str, Any]] = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    steps = [r for r in read_records(tmp_path / "run") if r["type"] == "step"]
    assert [s["overflow"] for s in steps] == [False, True, False, False]
    assert [s["loss_scale"] for s in steps] == [1024.0, 1024.0, 512.0, 512.0] and steps[1]["overflow_ranks"] == [1]
    first, second = ranks[0]["params"], ranks[1]["params"]
    assert first.keys() == second.keys() and all(".lora_" in n for n in first)
    assert all(torch.equal(first[n], second[n]) for n in first)
    assert (tmp_path / "run" / "export" / "adapter" / "adapter_model.safetensors").is_file()
