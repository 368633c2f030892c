"""A tiny random-init BERT encoder directory built on the fly (nothing is downloaded).

:func:`save_tiny_bert` writes what a pretrained encoder directory such as
all-MiniLM-L6-v2 holds: a ``BertModel`` (no classification head: loading it for sequence
classification initialises a fresh one) in safetensors, and a lower-casing WordPiece
tokenizer trained by ``tokenizers`` that wraps every text as ``[CLS] text [SEP]``
(``[PAD]`` is id 0). The weights use a large ``initializer_range`` so that attending to a
padded position, or attending causally, changes the logits visibly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CORPUS = [
    "the event loop runs coroutines and tasks",
    "an email message has headers and a payload",
    "the http client sends a request and reads the response",
    "parse the xml document into elements",
]
TINY_BERT: dict[str, Any] = {
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 64,
    "initializer_range": 0.5,
    "pad_token_id": 0,
}


def tiny_wordpiece() -> Any:
    """A BERT-style WordPiece ``PreTrainedTokenizerFast`` (``[CLS] $A [SEP]``) trained on :data:`CORPUS`."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=SPECIAL, show_progress=False)
    backend.train_from_iterator(CORPUS * 10, trainer=trainer)
    cls, sep = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def save_tiny_bert(directory: Path, seed: int = 0) -> Path:
    """A seeded random-init tiny ``BertModel`` and its tokenizer, ``save_pretrained`` into ``directory``.

    Built once per machine and seed (``tests/recipe_cache.py``), copied here.
    """
    from recipe_cache import copy_built

    return copy_built("tiny-bert", _write_tiny_bert, directory, seed=seed)


def _write_tiny_bert(directory: Path, seed: int) -> None:
    from transformers import BertConfig, BertModel

    tokenizer = tiny_wordpiece()
    torch.manual_seed(seed)
    model = BertModel(BertConfig(vocab_size=len(tokenizer), **TINY_BERT))
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))
