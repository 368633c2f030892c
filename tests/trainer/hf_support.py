"""Tiny Hugging Face models for the hf tests, built on the fly (nothing is downloaded).

:func:`build_model_root` writes, under one model root: ``llama/`` (a random-init 1-layer
Llama, hidden 16, vocabulary 300, safetensors, with a BPE tokenizer trained by ``tokenizers``),
``remote-code/`` (the same with ``auto_map`` in its config) and ``pickle-only/`` (weights only
as ``pytorch_model.bin``). The conftest's session fixture builds it once.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

#: The tiny Llama's config (also usable as an ``hf_config`` with ``model_type``).
TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "vocab_size": 300,
}
CORPUS = ["hello world, this is a tiny corpus", "the quick brown fox jumps over the lazy dog", "fine-tune me"]


def tiny_tokenizer() -> Any:
    """A byte-level BPE tokenizer of 300 tokens (``<pad>`` is id 0) as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def save_tiny_llama(directory: Path, seed: int = 0) -> None:
    """A seeded random-init tiny Llama and its tokenizer, ``save_pretrained`` into ``directory``.

    Built once per machine and seed (``tests/recipe_cache.py``), copied here.
    """
    from recipe_cache import copy_built

    copy_built("tiny-llama", _write_tiny_llama, directory, seed=seed)


def _write_tiny_llama(directory: Path, seed: int) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(TINY_LLAMA)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(str(directory), safe_serialization=True)
    tiny_tokenizer().save_pretrained(str(directory))


def build_model_root(root: Path) -> Path:
    """``root`` holding ``llama/``, ``remote-code/`` and ``pickle-only/`` (see the module docstring)."""
    save_tiny_llama(root / "llama")
    remote = root / "remote-code"
    shutil.copytree(root / "llama", remote)
    config = json.loads((remote / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (remote / "config.json").write_text(json.dumps(config))
    pickled = root / "pickle-only"
    shutil.copytree(root / "llama", pickled)
    (pickled / "model.safetensors").unlink()
    (pickled / "pytorch_model.bin").write_bytes(b"not really a pickle")
    return root


def lora_spec(**overrides: Any) -> dict[str, Any]:
    """A tiny ``hf`` LoRA job on the pretrained ``llama`` over byte-level text, fp32, 4 steps."""
    fields: dict[str, Any] = {
        "model": {"name": "hf", "config": {"path": "llama"}},
        "dataset": {"name": "text", "config": {"seq_len": 16, "max_bytes": 20000}},
        "adapter": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "micro_batch_size": 4,
        "max_steps": 4,
        "log_interval": 2,
        "optimizer": {"lr": 0.01},
        "seed": 0,
    }
    fields.update(overrides)
    return fields
