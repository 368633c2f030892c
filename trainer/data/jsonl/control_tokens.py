"""A row's own text never writes the tokenizer's control tokens (``<|im_end|>``, ``</s>``, ...).

A tokenizer reads its special and added-special tokens wherever they appear in the text it is
given, so a row whose text holds ``<|im_end|>`` would, tokenized as is, end a turn the row never
ended: a forged turn boundary that also moves the masking (a user's text trained as an assistant
turn, or an answer's end of sequence in mid-answer). Halfcast never lets a row's text do that:

- ``instruction`` rows are laid out by Halfcast's own prompt, which writes no control token, so
  their text is tokenized *as text* (``split_special_tokens``): ``<|im_end|>`` in an answer is
  trained as the characters it is made of, and the answer ends at the one EOS Halfcast appends;
- ``chat`` rows are laid out by the model's chat template, whose own control tokens must stay
  control tokens, so a message whose content holds one is refused (``data_unavailable`` naming
  ``messages[i].content`` and the token), as tiktoken refuses special tokens in text by default;
- ``text`` rows keep the tokenizer's reading: a corpus may separate documents with the EOS on purpose.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@functools.lru_cache(maxsize=4)  # one tokenizer per run: asked once per row
def control_tokens(tokenizer: PreTrainedTokenizerBase) -> tuple[str, ...]:
    """The strings ``tokenizer`` reads as one control token in any text: its special tokens and added special ones."""
    found = set(tokenizer.all_special_tokens)
    added = getattr(tokenizer, "added_tokens_decoder", {})
    found.update(token.content for token in added.values() if getattr(token, "special", False))
    return tuple(sorted(token for token in found if token))


def first_control_token(text: str, controls: tuple[str, ...]) -> str | None:
    """The first of ``controls`` (in ``text`` order) that ``text`` holds, or ``None``."""
    hits = [(text.find(token), token) for token in controls if token in text]
    return min(hits)[1] if hits else None


def encode_as_text(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """``text``'s token ids with no special token added and none read: a control token's string is its characters."""
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
