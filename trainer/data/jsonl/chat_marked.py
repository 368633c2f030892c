"""Chat masking from the template's own ``{% generation %}`` blocks.

A chat template may mark what the assistant generates with ``{% generation %}`` …
``{% endgeneration %}``. When it does, those marks decide what is trained, not the
prefix rendering of :mod:`trainer.data.jsonl.chat`: the trained tokens are exactly the
tokens overlapping a marked block (``apply_chat_template(return_assistant_tokens_mask=True)``),
plus the tokenizer's EOS where the template writes it right after a marked block (so the
model learns to stop even when the block ends before it). ``masking: "last"`` keeps the
marked tokens of the last assistant turn only (those after the conversation before it).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from trainer.data.jsonl.rows import row_error

if TYPE_CHECKING:
    from collections.abc import Sequence

    from transformers import PreTrainedTokenizerBase

#: A ``{% generation %}`` tag (the form transformers' template renderer recognises).
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def has_generation_blocks(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer's chat template marks the assistant's text with ``{% generation %}`` blocks."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and GENERATION_TAG.search(template) is not None


def marked_trainable(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, object]],
    full: list[int],
    since: int,
    where: tuple[str, int],
) -> list[bool]:
    """Per token of ``full`` (the conversation's ids), whether it is trained: marked and at or after ``since``.

    ``where`` is the row's ``(file, line)`` for the ``data_unavailable`` raised when the
    template fails, tokenizes differently from ``full``, or marks no token to train.
    """
    file, line = where
    try:
        out = tokenizer.apply_chat_template(
            list(messages),  # type: ignore[arg-type]  # transformers annotates dict[str, str]
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
    except Exception as exc:  # noqa: BLE001 (a chat template is arbitrary Jinja: any failure is this row's)
        raise row_error(file, line, "messages", f"the chat template failed: {type(exc).__name__}: {exc}") from None
    ids, marks = list(out["input_ids"]), list(out["assistant_masks"])  # type: ignore[call-overload,index]  # a dict
    if ids != full:
        what = "the chat template's tokens with its generation blocks tracked differ from its plain rendering"
        raise row_error(file, line, "messages", what)
    trainable = [bool(mark) and index >= since for index, mark in enumerate(marks)]
    _train_eos_after_blocks(trainable, full, tokenizer.eos_token_id)
    if not any(trainable[1:]):
        what = "the chat template's {% generation %} blocks mark no token of the assistant turns to train"
        raise row_error(file, line, "messages", what)
    return trainable


def _train_eos_after_blocks(trainable: list[bool], ids: list[int], eos_id: int | None) -> None:
    """Mark the EOS that directly follows a trained token (the end of a generation block)."""
    if eos_id is None:
        return
    for index in range(1, len(ids)):
        if ids[index] == eos_id and trainable[index - 1] and not trainable[index]:
            trainable[index] = True
