"""The LoRA benchmark's shared workload: one tiny causal LM on disk, one LoRA config, one token stream.

Every path trains the same thing: a seeded random-init Llama written with ``save_pretrained``
into a temporary *model root* (Halfcast reads it through its real ``hf`` loader, the peers
with ``from_pretrained``), wrapped by PEFT's LoRA on ``q_proj``/``v_proj``, on the same
preloaded byte-level micro-batches (Halfcast's ``text`` dataset over the Python standard
library: int64 ``[B, T]`` inputs and already-shifted targets), with fused AdamW over the
adapter weights, Halfcast's cosine LR schedule and clipping of the unscaled gradients.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from halfcast.contracts.spec import JobSpec
from trainer.data import Batch, build_dataset
from trainer.data.base import IGNORE_INDEX

LoraPrecision = Literal["fp16", "bf16", "fp32"]
#: Directory of the tiny model inside the temporary model root.
MODEL_NAME = "tiny-llama"
#: autocast dtype per precision (``None``: no autocast).
AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": None}


@dataclass(frozen=True)
class LoraWorkload:
    """Model sizes, LoRA settings, data and optimizer of the run (``lr`` per step, L2 clip norm).

    ``base_dtype``: where Halfcast keeps the frozen base weights (``fp32``, as the peers do,
    or ``compute``: Halfcast's default for bf16/fp16; path ``halfcast-compute``). ``total_steps``: the LR
    schedule's length (every step any path takes should fit in it).
    """

    precision: LoraPrecision = "bf16"
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    vocab_size: int = 512
    seq_len: int = 64
    micro_batch_size: int = 8
    num_batches: int = 8
    lora_r: int = 8
    lora_alpha: int = 16
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    max_grad_norm: float = 1.0
    base_dtype: Literal["fp32", "compute"] = "fp32"
    total_steps: int = 10_000
    log_interval: int = 10
    seed: int = 0
    #: Every path compiles its model (see :class:`bench.workload.Workload`).
    compile: bool = False

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype the peers ask autocast for (``None`` for fp32)."""
        return AUTOCAST_DTYPES[self.precision]


def hf_config_fields(work: LoraWorkload) -> dict[str, Any]:
    """The Llama config of ``work`` (``model_type`` included)."""
    return {
        "model_type": "llama",
        "hidden_size": work.hidden_size,
        "intermediate_size": work.intermediate_size,
        "num_hidden_layers": work.num_layers,
        "num_attention_heads": work.num_heads,
        "num_key_value_heads": work.num_heads,
        "max_position_embeddings": max(128, work.seq_len),
        "vocab_size": work.vocab_size,
    }


def save_model(work: LoraWorkload, root: Path) -> Path:
    """Write the seeded random-init float32 model into ``root / MODEL_NAME`` (safetensors); return it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = hf_config_fields(work)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(work.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    directory = root / MODEL_NAME
    model.save_pretrained(str(directory), safe_serialization=True)
    return directory


@contextmanager
def model_roots(root: Path) -> Iterator[None]:
    """``HALFCAST_MODEL_ROOTS`` set to ``root`` inside the block (restored after)."""
    before = os.environ.get("HALFCAST_MODEL_ROOTS")
    os.environ["HALFCAST_MODEL_ROOTS"] = str(root)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("HALFCAST_MODEL_ROOTS", None)
        else:
            os.environ["HALFCAST_MODEL_ROOTS"] = before


def job_spec(work: LoraWorkload) -> JobSpec:
    """The Halfcast ``hf`` + LoRA job of ``work`` (default dynamic loss scale for fp16, fused AdamW)."""
    return JobSpec.model_validate(
        {
            "model": {"name": "hf", "config": {"path": MODEL_NAME}},
            "adapter": {
                "type": "lora",
                "r": work.lora_r,
                "alpha": work.lora_alpha,
                "target_modules": list(work.target_modules),
                "base_dtype": work.base_dtype,
            },
            "dataset": {"name": "text", "config": {"seq_len": work.seq_len, "max_bytes": _text_bytes(work)}},
            "precision": work.precision,
            "micro_batch_size": work.micro_batch_size,
            "max_steps": work.total_steps,
            "optimizer": {"name": "adamw", "lr": work.lr, "weight_decay": work.weight_decay, "implementation": "fused"},
            "lr_scheduler": {"name": "cosine", "warmup_steps": work.warmup_steps, "min_lr_ratio": work.min_lr_ratio},
            "max_grad_norm": work.max_grad_norm,
            "log_interval": work.log_interval,
            "seed": work.seed,
            "compile": work.compile,
        }
    )


def _text_bytes(work: LoraWorkload) -> int:
    """Enough standard-library bytes for ``num_batches`` micro-batches plus the held-out tail."""
    needed = work.micro_batch_size * work.num_batches * (work.seq_len + 1)
    return max(1024, math.ceil(needed * 1.3) + 4096)


def make_batches(work: LoraWorkload) -> list[Batch]:
    """``num_batches`` CPU micro-batches, the first of Halfcast's own ``text`` stream for ``work``."""
    spec = job_spec(work)
    dataset = build_dataset(spec.dataset)
    stream = dataset.train_batches(work.micro_batch_size, rank=0, world_size=1, seed=work.seed)
    return list(islice(stream, work.num_batches))


def lora_config(work: LoraWorkload) -> Any:
    """PEFT's ``LoraConfig`` of ``work`` (no dropout: Halfcast's default)."""
    from peft import LoraConfig, TaskType

    return LoraConfig(
        r=work.lora_r,
        lora_alpha=work.lora_alpha,
        lora_dropout=0.0,
        task_type=TaskType.CAUSAL_LM,
        target_modules=list(work.target_modules),
    )


def peer_model(work: LoraWorkload, directory: Path) -> nn.Module:
    """The peers' model: ``from_pretrained`` (float32) + ``get_peft_model``, in training mode, seeded."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32, local_files_only=True)
    base.config.use_cache = False
    torch.manual_seed(work.seed)  # LoRA's A matrices: the same draw as Halfcast's (seeded before the build)
    return get_peft_model(base, lora_config(work)).train()


def mean_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Float32 mean next-token cross-entropy of logits ``[B, T, V]`` against already-shifted targets ``[B, T]``."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)
