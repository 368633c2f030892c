"""The ``model_type`` values a registered model (``POST /models``) may have. Torch-free.

Each is a Transformers architecture with a causal-LM or a sequence-classification head
(the tasks an ``hf`` job trains): ``tests/trainer/test_hf_model_types.py`` checks the
list against the installed Transformers' auto mappings. A model directory under a
model root is not held to this list (Transformers refuses what it cannot load).
"""

from __future__ import annotations

#: Model types an uploaded ``config.json`` may name.
REGISTRY_MODEL_TYPES: frozenset[str] = frozenset({
    # decoders (causal LM; most also have a sequence-classification head)
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "phi", "phi3",
    "gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "falcon", "bloom", "olmo", "olmo2", "stablelm", "starcoder2",
    "granite", "cohere",
    # encoders (sequence classification)
    "bert", "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2", "xlm-roberta", "mpnet",
})  # fmt: skip  # a word list, packed a family to a line under its kind
