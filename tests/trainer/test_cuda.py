"""CUDA checks (marked ``gpu``; skipped without CUDA): precisions, fused optimizers, fp8, NCCL DDP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from halfcast.contracts.spec import JobSpec
from trainer.numerics.precision import PrecisionUnsupportedError
from trainer.parallel.distributed import DistContext
from trainer.run.loop import train

pytestmark = pytest.mark.gpu

DIGITS: dict[str, Any] = {
    "model": {"name": "mlp", "config": {"hidden_sizes": [128]}},
    "dataset": {"name": "digits"},
    "micro_batch_size": 64,
    "max_steps": 150,
    "gpus": 1,
    "optimizer": {"name": "adamw", "lr": 3e-3, "implementation": "fused"},
}


def _ctx() -> DistContext:
    return DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cuda", 0))


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_digits_learns_on_cuda_with_fused_adamw(precision: str, tmp_path: Path) -> None:
    extra = {"loss_scale": {"init_scale": 2.0**24}} if precision == "fp16" else {}
    spec = JobSpec.model_validate(DIGITS | {"precision": precision} | extra)
    result = train(spec, tmp_path, _ctx())
    accuracy = result.final_eval["accuracy"] if result.final_eval is not None else None
    assert accuracy is not None and accuracy >= 0.9
    if precision == "fp16":
        assert result.skipped_steps > 0  # 2**24 overflows first, then backs off


def test_fp16_overflow_skip_with_fused_optimizer_on_cuda(tmp_path: Path) -> None:
    spec = JobSpec.model_validate(
        DIGITS | {"precision": "fp16", "max_steps": 6, "faults": {"nonfinite_grad_steps": [2, 3]}}
    )
    train(spec, tmp_path, _ctx())
    lines = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    steps = [s for s in lines if s["type"] == "step"]
    assert [s["overflow"] for s in steps] == [False, True, True, False, False, False]
    assert steps[2]["loss_scale"] == steps[1]["loss_scale"] / 2


def test_fp8_on_capable_gpu_or_rejected(tmp_path: Path) -> None:
    spec = JobSpec.model_validate(
        DIGITS
        | {"precision": "fp8", "max_steps": 20, "model": {"name": "mlp", "config": {"hidden_sizes": [256, 256, 256]}}}
    )
    capable = torch.cuda.get_device_capability(0) >= (8, 9)
    try:
        import torchao  # noqa: F401
    except ImportError:
        capable = False
    if not capable:
        with pytest.raises(PrecisionUnsupportedError):
            train(spec, tmp_path, _ctx())
        return
    result = train(spec, tmp_path, _ctx())
    assert result.steps == 20


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs for NCCL DDP")
def test_nccl_ddp_two_gpus(tmp_path: Path) -> None:
    spec = DIGITS | {"precision": "bf16", "gpus": 2, "max_steps": 30, "gradient_accumulation_steps": 2}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "-m",
        "trainer",
        "--spec",
        str(tmp_path / "spec.json"),
        "--run-dir",
        str(tmp_path),
    ]
    subprocess.run(
        cmd, check=True, timeout=300, env={**os.environ, "HALFCAST_DUMP_PARAMS": "1", "HALFCAST_ALLOW_FAULTS": "1"}
    )
    ranks = [torch.load(tmp_path / f"params-rank{r}.pt") for r in range(2)]
    for name, value in ranks[0].items():
        assert torch.equal(value, ranks[1][name]), name


#: A random-init Llama large enough for fp8 GEMMs (dims multiples of 16), over byte-level text.
HF_LORA: dict[str, Any] = {
    "model": {
        "name": "hf",
        "config": {
            "hf_config": {
                "model_type": "llama",
                "hidden_size": 128,
                "intermediate_size": 256,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "max_position_embeddings": 128,
                "vocab_size": 256,
            }
        },
    },
    "dataset": {"name": "text", "config": {"seq_len": 64, "max_bytes": 200000}},
    "adapter": {"r": 16, "alpha": 32, "target_modules": "all-linear"},
    "micro_batch_size": 8,
    "max_steps": 10,
    "gpus": 1,
    "log_interval": 5,
    "optimizer": {"name": "adamw", "lr": 1e-3, "implementation": "fused"},
}


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp8"])
def test_hf_lora_job_on_cuda(precision: str, tmp_path: Path) -> None:
    """An hf LoRA job trains on CUDA in each half precision; fp8 (capable GPUs with torchao) converts
    only the frozen base Linears, never the adapter factors."""
    if precision == "fp8" and torch.cuda.get_device_capability(0) < (8, 9):
        pytest.skip("fp8 needs compute capability >= 8.9")
    spec = JobSpec.model_validate(HF_LORA | {"precision": precision})
    result = train(spec, tmp_path, _ctx())
    assert result.steps == 10 and result.skipped_steps <= 2
    if precision == "fp8":
        converted = [n for n, m in result.model.named_modules() if type(m).__name__ == "Float8Linear"]
        assert converted and all(n.endswith(".base_layer") for n in converted)
    assert (tmp_path / "export" / "adapter" / "adapter_model.safetensors").is_file()
