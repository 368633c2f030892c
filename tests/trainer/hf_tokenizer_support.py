"""A tiny Hugging Face tokenizer built on the fly (never downloaded), and a session fixture that loads it.

A byte-level BPE trained with ``tokenizers`` on a few sentences (so any text encodes),
wrapped as ``PreTrainedTokenizerFast`` with ``<pad>``, ``<s>`` (BOS, added in front by
``add_special_tokens=True``) and ``</s>`` (EOS), the ChatML turn markers
``<|im_start|>``/``<|im_end|>``, and a ChatML-like chat template (system, user,
assistant and tool roles) that starts with the BOS itself: tokenizing its text *with*
special tokens would double the BOS. Saved with ``save_pretrained`` and loaded back with
``AutoTokenizer.from_pretrained(dir, local_files_only=True)``, as a model directory's
tokenizer is.

Use it from a test module with ``from hf_tokenizer_support import hf_tokenizer_fixture  # noqa: F401``
(registered under its name, ``hf_tokenizer``, so a test's parameter does not shadow the import).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PAD, BOS, EOS, IM_START, IM_END = "<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, IM_START, IM_END]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TRAINING_TEXT = [
    "Hello there, how are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "Write a short poem about the sea and the sky.",
    "### Instruction:\nTranslate to French.\n\n### Input:\ngood morning\n\n### Response:\nbonjour",
]


def build_tokenizer_dir(directory: Path, chat_template: str | None = CHAT_TEMPLATE) -> Path:
    """Train the tiny BPE and ``save_pretrained`` it into ``directory`` (returned); ``chat_template=None``: none.

    Built once per machine and template (``tests/recipe_cache.py``), copied here.
    """
    from recipe_cache import copy_built

    return copy_built("chat-tokenizer", _write_tokenizer, directory, chat_template=chat_template)


def _write_tokenizer(directory: Path, chat_template: str | None) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(TRAINING_TEXT, trainer=trainer)
    bos_id = backend.token_to_id(BOS)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=chat_template,
    )
    wrapped.save_pretrained(directory)


def save_chat_llama(directory: Path, seed: int = 0) -> Path:
    """A seeded random-init 1-layer Llama sized for the tiny tokenizer, saved with it (safetensors) into ``directory``.

    Built once per machine and seed (``tests/recipe_cache.py``), copied here.
    """
    from recipe_cache import copy_built

    return copy_built("chat-llama", _write_chat_llama, directory, seed=seed)


def _write_chat_llama(directory: Path, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    _write_tokenizer(directory, CHAT_TEMPLATE)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        vocab_size=len(load_tokenizer(directory)),
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(str(directory), safe_serialization=True)


def load_tokenizer(directory: Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in ``directory``, loaded offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, local_files_only=True)


@pytest.fixture(scope="session", name="hf_tokenizer")
def hf_tokenizer_fixture(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerBase:
    """The tiny tokenizer, built and loaded once per test session."""
    return load_tokenizer(build_tokenizer_dir(tmp_path_factory.mktemp("hf-tokenizer")))
