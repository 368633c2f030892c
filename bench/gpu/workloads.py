"""The same model and batches for both paths: Halfcast's job spec, and the plain model the hand loop builds.

GPT: :class:`trainer.models.gpt.GPT` on Halfcast's byte-level ``text`` data. HF LoRA: a
random-init Llama built on the fly from its config (``AutoModelForCausalLM.from_config``, SDPA
attention; nothing is downloaded), with PEFT's LoRA on every Linear but the head; its frozen
base weights are kept in the compute dtype on both paths (Halfcast's default ``base_dtype``).
Both paths are seeded alike and read the same preloaded micro-batches.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

import torch
from torch import nn

from bench.gpu.settings import CheckSettings, GptSize, LlamaSize, ModelKind
from halfcast.contracts.spec import JobSpec
from trainer.data import Batch, build_dataset
from trainer.data.base import IGNORE_INDEX
from trainer.models.gpt import GPT

#: Byte-level vocabulary of the ``text`` data.
BYTE_VOCAB = 256
#: Micro-batches preloaded on the device and cycled (input loading is not what is measured).
PRELOADED = 8
#: The seed of every model and data stream.
SEED = 0
#: Compute dtype per precision (fp8 computes the non-fp8 parts in bf16).
COMPUTE_DTYPES: dict[str, torch.dtype] = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


def llama_fields(size: LlamaSize) -> dict[str, Any]:
    """The Llama config (``model_type`` included), byte-level vocabulary, context ``seq_len``."""
    return {
        "model_type": "llama",
        "hidden_size": size.hidden_size,
        "intermediate_size": size.intermediate_size,
        "num_hidden_layers": size.num_layers,
        "num_attention_heads": size.num_heads,
        "num_key_value_heads": size.num_heads,
        "max_position_embeddings": size.seq_len,
        "vocab_size": BYTE_VOCAB,
    }


def _model_block(model: ModelKind, settings: CheckSettings) -> dict[str, Any]:
    if model is ModelKind.GPT:
        gpt = settings.gpt
        return {
            "model": {"name": "gpt", "config": {"n_layer": gpt.n_layer, "n_head": gpt.n_head, "d_model": gpt.d_model}}
        }
    llama = settings.llama
    return {
        "model": {"name": "hf", "config": {"hf_config": llama_fields(llama)}},
        "adapter": {"r": llama.lora_r, "alpha": llama.lora_alpha, "target_modules": "all-linear"},
    }


def job_spec(model: ModelKind, precision: str, settings: CheckSettings, world_size: int = 1) -> JobSpec:
    """Halfcast's job for ``model`` in ``precision``: one GPU per rank (CPU for a dry run), fused AdamW by default.

    Raises ``pydantic.ValidationError`` for fp8 on a dry run (the spec refuses fp8 without GPUs).
    """
    size = settings.size_of(model)
    counts = settings.counts
    return JobSpec.model_validate(
        _model_block(model, settings)
        | {
            "dataset": {
                "name": "text",
                "config": {"seq_len": size.seq_len, "max_bytes": settings.max_bytes, "test_fraction": 0.05},
            },
            "precision": precision,
            "gpus": 0 if settings.dry_run else world_size,
            "processes": world_size if settings.dry_run else 1,
            "micro_batch_size": size.batch,
            "max_steps": counts.warmup + counts.steps,
            "log_interval": counts.log_interval,
            "max_grad_norm": 1.0,
            "optimizer": {"name": "adamw", "lr": 3e-4, "weight_decay": 0.1, "implementation": settings.implementation},
            "lr_scheduler": {"name": "cosine", "warmup_steps": 2},
            "seed": SEED,
            "compile": settings.compile,
        }
    )


def preload(spec: JobSpec, device: torch.device, rank: int = 0, world_size: int = 1) -> list[Batch]:
    """This rank's first :data:`PRELOADED` micro-batches of the job's data, already on ``device``."""
    dataset = build_dataset(spec.dataset)
    stream = dataset.train_batches(spec.micro_batch_size, rank=rank, world_size=world_size, seed=spec.seed)
    return [batch.to(device) for batch in islice(stream, PRELOADED)]


def attention_shape(model: ModelKind, settings: CheckSettings) -> tuple[int, int, int]:
    """``(n_layer, seq_len, d_model)`` of ``model``, for the attention FLOPs."""
    size = settings.size_of(model)
    if isinstance(size, GptSize):
        return size.n_layer, size.seq_len, size.d_model
    return size.num_layers, size.seq_len, size.hidden_size


def plain_gpt(size: GptSize) -> nn.Module:
    """The float32 GPT the hand loop trains, seeded as Halfcast seeds its own."""
    torch.manual_seed(SEED)
    return GPT(BYTE_VOCAB, size.seq_len, n_layer=size.n_layer, n_head=size.n_head, d_model=size.d_model)


def plain_lora_llama(size: LlamaSize, compute_dtype: torch.dtype) -> nn.Module:
    """``from_config`` + ``get_peft_model`` (LoRA on all Linears), frozen base weights in ``compute_dtype``."""
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = llama_fields(size)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(SEED)
    base = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    lora = LoraConfig(
        r=size.lora_r,
        lora_alpha=size.lora_alpha,
        lora_dropout=0.0,
        task_type=TaskType.CAUSAL_LM,
        target_modules="all-linear",
    )
    model = get_peft_model(base, lora)
    for parameter in model.parameters():
        if not parameter.requires_grad:
            parameter.data = parameter.data.to(compute_dtype)
    return model.train()


def plain_model(model: ModelKind, settings: CheckSettings, precision: str) -> nn.Module:
    """The hand loop's float32-master model of ``model`` (on the CPU; the caller moves it)."""
    if model is ModelKind.GPT:
        return plain_gpt(settings.gpt)
    return plain_lora_llama(settings.llama, COMPUTE_DTYPES[precision])


def plain_logits(model: nn.Module, kind: ModelKind, batch: Batch) -> torch.Tensor:
    """Logits ``[B, T, V]`` of a plain model (Hugging Face models without a mask: causal SDPA)."""
    if kind is ModelKind.GPT:
        return model(batch.inputs)
    return model(input_ids=batch.inputs, use_cache=False).logits


def mean_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Float32 mean next-token cross-entropy (targets already shifted, padding ignored)."""
    flat = logits.float().reshape(-1, logits.shape[-1])
    return nn.functional.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE_INDEX)
