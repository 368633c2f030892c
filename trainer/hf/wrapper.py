"""The module the loop trains for an ``hf`` job: ``(inputs, attention_mask)`` -> logits.

Causal LM: logits ``[B, T, V]`` (the targets are already shifted; the model's own loss is
never used). Sequence classification: ``[B, num_labels]`` (Hugging Face's head pools the last
token that is not ``config.pad_token_id`` in a decoder, the first (``[CLS]``) token in an encoder
such as BERT, whose attention is bidirectional: padded keys are masked, nothing else). The attention mask reaches
the model as a 4-D
boolean ``[B or 1, 1, T, T]`` mask built here with device ops only: given a 2-D mask,
Hugging Face would read its values on the host to decide whether SDPA can skip it (a host
synchronisation every micro-batch), and without one it inspects the position ids the same
way. Every query may also attend to itself, so no row is fully masked (padded positions
carry no loss).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

#: Prefixes of the module paths PEFT and this wrapper add in front of the model's own names.
_NAME_PREFIXES = ("model.", "base_model.model.")


class HFModule(nn.Module):
    """A Hugging Face (optionally PEFT-wrapped) model as a Halfcast model.

    ``model``: the Hugging Face or ``PeftModel``; ``causal``: whether its attention is causal;
    ``adapter``: whether only the trainable parameters (adapter and head) are checkpointed.
    """

    def __init__(self, model: nn.Module, *, causal: bool, adapter: bool) -> None:
        super().__init__()
        self.model = model
        self.causal = causal
        self.adapter = adapter

    @property
    def architecture(self) -> str:
        """The Hugging Face class name of the base model (e.g. ``LlamaForCausalLM``)."""
        base = self.base_model()
        return type(base).__name__

    def base_model(self) -> nn.Module:
        """The Hugging Face model inside the PEFT wrapper (or the model itself)."""
        get_base = getattr(self.model, "get_base_model", None)
        return get_base() if callable(get_base) else self.model

    def forward(self, inputs: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Logits for int64 token ids ``[B, T]`` and an optional ``[B, T]`` mask (1 = real token)."""
        mask = self._mask(inputs, attention_mask)
        return self.model(input_ids=inputs, attention_mask=mask, use_cache=False).logits

    def _mask(self, inputs: Tensor, attention_mask: Tensor | None) -> Tensor | None:
        length = inputs.shape[1]
        eye = torch.eye(length, dtype=torch.bool, device=inputs.device)
        allowed = torch.ones(length, length, dtype=torch.bool, device=inputs.device).tril() if self.causal else None
        if attention_mask is None:
            return None if allowed is None else allowed[None, None]
        keys = attention_mask.to(torch.bool)[:, None, None, :]
        visible = keys if allowed is None else keys & allowed
        return visible | eye

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_keys(self) -> frozenset[str] | None:
        """State-dict keys a checkpoint holds: the trainable parameters of an adapter job, else all (``None``)."""
        if not self.adapter:
            return None
        return frozenset(name for name, p in self.named_parameters() if p.requires_grad)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """Load a full state dict, or (adapter jobs) exactly the :meth:`checkpoint_keys` ones.

        Raises ``RuntimeError`` when a partial dict does not hold exactly the trainable keys.
        """
        keys = self.checkpoint_keys()
        if keys is None or set(state_dict) == set(self.state_dict()):
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        if strict and set(state_dict) != keys:
            missing, unexpected = sorted(keys - set(state_dict)), sorted(set(state_dict) - keys)
            raise RuntimeError(
                f"adapter checkpoint does not match the model: missing {missing[:4]}, unexpected {unexpected[:4]}"
            )
        return super().load_state_dict(state_dict, strict=False, assign=assign)

    # ------------------------------------------------------------------ names

    @staticmethod
    def readable_name(name: str) -> str:
        """A parameter's module path without the wrapper's and PEFT's prefixes
        (``model.base_model.model.model.layers.0...`` -> ``model.layers.0...``)."""
        for prefix in _NAME_PREFIXES:
            name = name.removeprefix(prefix)
        return name

    def readable_names(self, names: Iterable[str]) -> list[str]:
        """:meth:`readable_name` of each name."""
        return [self.readable_name(n) for n in names]
