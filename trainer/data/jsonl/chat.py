"""Chat rows rendered with the tokenizer's chat template, and the exact tokens of each assistant turn.

The whole conversation is rendered once (``apply_chat_template(tokenize=False)``) and
tokenized without adding special tokens (the template holds them, so a BOS is never
doubled). An assistant turn ``i`` spans from the end of the conversation before it
rendered *with* the generation prompt (so the template's assistant header is not
trained) to the end of the conversation up to and including it (so the template's
end-of-turn tokens are trained and the model learns to stop; the next turn's header
is not). Each prefix is tokenized on its own and must be a token prefix of the whole
conversation; a template for which that does not hold fails the row instead of
masking the wrong tokens. A template that writes no generation prompt (it ignores
``add_generation_prompt``) writes the header as part of the assistant turn: there the turn's
trained tokens start where its rendering departs from the same turn rendered with empty
content, so the header is never trained either way.

A template with ``{% generation %}`` blocks is masked by its blocks instead
(:mod:`trainer.data.jsonl.chat_marked`).

Masking: ``assistant`` trains every assistant turn, ``last`` only the last one,
``none`` every token. System, user and tool turns are never trained unless ``none``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from halfcast.contracts.status import FailureReason
from trainer.data.jsonl.chat_marked import has_generation_blocks, marked_trainable
from trainer.data.jsonl.control_tokens import control_tokens, first_control_token
from trainer.data.jsonl.formats import ChatExample
from trainer.data.jsonl.rows import row_error
from trainer.data.jsonl.tokens import TokenExample, encode
from trainer.errors import TrainerError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Messages = Sequence[dict[str, object]]


def check_chat_template(tokenizer: PreTrainedTokenizerBase) -> None:
    """``spec_invalid`` when the tokenizer has no chat template to render chats with."""
    if not getattr(tokenizer, "chat_template", None):
        raise TrainerError(
            FailureReason.SPEC_INVALID, "format 'chat' needs a tokenizer with a chat template, and it has none"
        )


def chat_tokens(example: ChatExample, tokenizer: PreTrainedTokenizerBase, masking: str, file: str) -> TokenExample:
    """The conversation's token ids, with the tokens of the assistant turns ``masking`` picks trainable.

    Raises ``data_unavailable`` naming ``file`` and the row's line for a chat without an
    assistant turn to train, a template that fails on it, or one whose prefixes do not
    tokenize as prefixes of the whole conversation.
    """
    messages = list(example.messages)
    _check_no_control_tokens(example, tokenizer, file)
    full = _render(tokenizer, messages, example.line, file, generation_prompt=False)
    trainable = [masking == "none"] * len(full)
    if masking == "none":
        return TokenExample(example.line, full, trainable)
    turns = [index for index, message in enumerate(messages) if message["role"] == "assistant"]
    if not turns:
        raise row_error(file, example.line, "messages", f"no assistant turn to train (masking '{masking}')")
    picked = turns[-1:] if masking == "last" else turns
    if has_generation_blocks(tokenizer):
        since = 0
        if masking == "last":
            since = _prefix_length(tokenizer, messages[: picked[0]], full, example.line, file, generation_prompt=False)
        return TokenExample(
            example.line, full, marked_trainable(tokenizer, messages, full, since, (file, example.line))
        )
    for index in picked:
        start = _turn_start(tokenizer, messages, index, full, (file, example.line))
        end = _prefix_length(tokenizer, messages[: index + 1], full, example.line, file, generation_prompt=False)
        if end <= start:
            raise row_error(
                file, example.line, f"messages[{index}]", "the chat template renders this turn as no tokens"
            )
        trainable[start:end] = [True] * (end - start)
    return TokenExample(example.line, full, trainable)


def _check_no_control_tokens(example: ChatExample, tokenizer: PreTrainedTokenizerBase, file: str) -> None:
    """``data_unavailable`` naming the first message whose content holds one of the tokenizer's control tokens.

    The template's text is tokenized with its control tokens read as such, so one written by a message
    would end or open a turn the conversation does not have (:mod:`trainer.data.jsonl.control_tokens`).
    """
    controls = control_tokens(tokenizer)
    for index, message in enumerate(example.messages):
        content = message.get("content")
        token = first_control_token(content, controls) if isinstance(content, str) else None
        if token is not None:
            what = (
                f"holds {token!r}, one of the tokenizer's control tokens: the chat template's text would read it as"
                " a turn marker, not as text; remove it from the data or write it another way"
            )
            raise row_error(file, example.line, f"messages[{index}].content", what)


def _turn_start(
    tokenizer: PreTrainedTokenizerBase, messages: Messages, index: int, full: list[int], where: tuple[str, int]
) -> int:
    """Where assistant turn ``index``'s trained tokens start: after the header the template writes for it.

    The header is the generation prompt; a template without one writes it inside the turn,
    where it is what the turn shares with the same turn rendered with empty content.
    """
    file, line = where
    prompted = _prefix_length(tokenizer, messages[:index], full, line, file, generation_prompt=True)
    before = _prefix_length(tokenizer, messages[:index], full, line, file, generation_prompt=False)
    if prompted > before:
        return prompted
    empty_turn: list[dict[str, object]] = [*messages[:index], {"role": "assistant", "content": ""}]
    probe = _render(tokenizer, empty_turn, line, file, generation_prompt=False)
    return max(before, _common_prefix_length(probe, full))


def _common_prefix_length(first: list[int], second: list[int]) -> int:
    """How many leading tokens ``first`` and ``second`` share."""
    for position, (a, b) in enumerate(zip(first, second, strict=False)):
        if a != b:
            return position
    return min(len(first), len(second))


def _prefix_length(
    tokenizer: PreTrainedTokenizerBase,
    messages: Messages,
    full: list[int],
    line: int,
    file: str,
    *,
    generation_prompt: bool,
) -> int:
    """Tokens of ``messages`` rendered alone, checked to be a prefix of ``full``."""
    ids = _render(tokenizer, messages, line, file, generation_prompt=generation_prompt)
    if full[: len(ids)] != ids:
        what = (
            f"the chat template does not render the first {len(messages)} messages"
            f"{' with the generation prompt' if generation_prompt else ''} as a token prefix of the whole"
            " conversation, so its assistant turns cannot be located exactly (use masking 'none' or another template)"
        )
        raise row_error(file, line, "messages", what)
    return len(ids)


def _render(
    tokenizer: PreTrainedTokenizerBase, messages: Messages, line: int, file: str, *, generation_prompt: bool
) -> list[int]:
    try:
        text = tokenizer.apply_chat_template(
            list(messages),  # type: ignore[arg-type]  # transformers annotates dict[str, str]; a row keeps its other keys
            tokenize=False,
            add_generation_prompt=generation_prompt,
        )
    except Exception as exc:  # noqa: BLE001 (a chat template is arbitrary Jinja: any failure is this row's)
        raise row_error(file, line, "messages", f"the chat template failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(text, str):
        raise TrainerError(
            FailureReason.SPEC_INVALID, "the tokenizer's apply_chat_template(tokenize=False) did not return text"
        )
    return encode(tokenizer, text)
