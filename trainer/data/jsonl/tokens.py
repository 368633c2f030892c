"""Token ids and trainable flags of text, instruction and classification examples.

A :class:`TokenExample` holds a sequence's token ids and, per token, whether it is
a training target (predicted from the tokens before it; the first token never is).
Special tokens follow the tokenizer: what ``add_special_tokens=True`` puts *before*
the text (a BOS, if the tokenizer adds one) starts every sequence exactly once, and a
language-modelling sequence ends with the tokenizer's EOS, which is trained.

Instruction rows are rendered with the Alpaca prompt (:data:`PROMPT_WITH_INPUT`,
:data:`PROMPT_WITHOUT_INPUT` when ``input`` is empty); ``output`` follows it directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from halfcast.contracts.status import FailureReason
from trainer.data.jsonl.control_tokens import encode_as_text
from trainer.data.jsonl.formats import InstructionExample, TextExample
from trainer.errors import TrainerError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
PROMPT_WITHOUT_INPUT = "### Instruction:\n{instruction}\n\n### Response:\n"
_PROBE = "probe"


@dataclass(frozen=True)
class TokenExample:
    """``ids``: token ids; ``trainable[i]``: ``ids[i]`` is a target (same length; ``trainable[0]`` unused)."""

    line: int
    ids: list[int]
    trainable: list[bool]

    @property
    def num_trainable(self) -> int:
        """Targets that carry loss: trainable tokens after the first."""
        return sum(self.trainable[1:])

    def truncated(self, length: int) -> TokenExample:
        """The first ``length`` tokens."""
        return TokenExample(self.line, self.ids[:length], self.trainable[:length])


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """``text``'s token ids without any special tokens added."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def leading_special_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The ids ``add_special_tokens=True`` puts before a text (e.g. ``[bos]``, or ``[]``)."""
    plain = encode(tokenizer, _PROBE)
    full = list(tokenizer(_PROBE, add_special_tokens=True)["input_ids"])
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start]
    return []


def eos_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The tokenizer's EOS id; ``spec_invalid`` when it has none (the model could never learn to stop)."""
    if tokenizer.eos_token_id is None:
        raise TrainerError(
            FailureReason.SPEC_INVALID, "the tokenizer has no EOS token: language-modelling formats need one"
        )
    return int(tokenizer.eos_token_id)


def text_tokens(example: TextExample, tokenizer: PreTrainedTokenizerBase, prefix: list[int]) -> TokenExample:
    """``prefix + text + eos``, every token trained."""
    ids = prefix + encode(tokenizer, example.text) + [eos_id(tokenizer)]
    return TokenExample(example.line, ids, [True] * len(ids))


def instruction_prompt(example: InstructionExample) -> str:
    """The Alpaca prompt of ``example`` (ends with ``"### Response:\\n"``)."""
    if example.input.strip():
        return PROMPT_WITH_INPUT.format(instruction=example.instruction, input=example.input)
    return PROMPT_WITHOUT_INPUT.format(instruction=example.instruction)


def instruction_tokens(
    example: InstructionExample, tokenizer: PreTrainedTokenizerBase, prefix: list[int], masking: str
) -> TokenExample:
    """``prefix + prompt + output + eos``; masking ``output`` trains ``output + eos`` only, ``none`` everything.

    The row's text is tokenized as text: a control token's string in it is trained as its characters
    (:mod:`trainer.data.jsonl.control_tokens`).
    """
    prompt = prefix + encode_as_text(tokenizer, instruction_prompt(example))
    answer = [*encode_as_text(tokenizer, example.output), eos_id(tokenizer)]
    trainable = [masking == "none"] * len(prompt) + [True] * len(answer)
    return TokenExample(example.line, prompt + answer, trainable)


def classification_ids(text: str, tokenizer: PreTrainedTokenizerBase, max_len: int) -> tuple[list[int], bool]:
    """``(ids, truncated)``: ``text`` with the special tokens the tokenizer adds (as for a
    sequence-classification model), at most ``max_len`` ids.

    A longer text is cut by the tokenizer's own truncation, which keeps its special tokens: an
    encoder's closing ``[SEP]`` (or a decoder's appended EOS) stays the last id, as the model saw
    it in pre-training, instead of being cut off with the text's tail.
    """
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    if len(ids) <= max_len:
        return ids, False
    cut = tokenizer(text, add_special_tokens=True, truncation=True, max_length=max_len)["input_ids"]
    return list(cut), True
