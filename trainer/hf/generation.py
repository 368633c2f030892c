"""The export's ``generation_config.json``: generation stops where training taught the model to stop.

A chat model learns to end its turn with whatever its template writes after the assistant's
content (ChatML's ``<|im_end|>``, Llama 3's ``<|eot_id|>``), which is often not the tokenizer's
EOS. The export's generation config therefore lists the tokenizer's EOS and every special token
the template's end of an assistant turn holds (the trained tokens of a probe conversation, by
the same masking as the job's chat rows), with the tokenizer's BOS and the pad token batches
were padded with (the EOS when the tokenizer has none). A job without a tokenizer (byte-level)
keeps the model's own generation config.
"""

from __future__ import annotations

from typing import Any

from trainer.data.jsonl.chat import chat_tokens
from trainer.data.jsonl.formats import ChatExample
from trainer.errors import TrainerError

#: A conversation whose last assistant turn shows what the template writes around a reply.
_PROBE = ChatExample(0, ({"role": "user", "content": "ping"}, {"role": "assistant", "content": "pong"}))


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """The special tokens the chat template trains at the end of an assistant turn (none without a template)."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    try:
        probe = chat_tokens(_PROBE, tokenizer, "last", "<probe>")
    except TrainerError:
        return []
    special = set(tokenizer.all_special_ids)
    trained = [token for token, train in zip(probe.ids, probe.trainable, strict=True) if train]
    return list(dict.fromkeys(token for token in trained if token in special))


def apply_generation_config(model: Any, tokenizer: Any | None) -> None:
    """Set ``model.generation_config``'s EOS, BOS and pad ids from ``tokenizer`` (see the module docstring)."""
    config = getattr(model, "generation_config", None)
    if tokenizer is None or config is None or not model.can_generate():
        return  # byte-level, or a model that does not generate (sequence classification)
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    eos += [token for token in end_of_turn_ids(tokenizer) if token not in eos]
    if eos:
        config.eos_token_id = eos if len(eos) > 1 else eos[0]
    config.bos_token_id = tokenizer.bos_token_id
    config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or [None])[0]
