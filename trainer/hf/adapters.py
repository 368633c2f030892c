"""LoRA adapters through PEFT: which modules they wrap, and where the frozen base weights live.

Every ``target_modules`` entry must match at least one module (PEFT only fails when *none*
matches, so a typo in one entry would silently train less): an entry matches a module whose
path equals it or ends with ``.<entry>``. Adapter (and classification-head) parameters stay
float32 master weights; with ``base_dtype`` ``compute`` the frozen parameters are cast to the
compute dtype (bf16/fp16), which autocast computes in anyway.
"""

from __future__ import annotations

import torch
from torch import nn

from halfcast.contracts.catalog import HFConfig
from halfcast.contracts.spec import AdapterSpec
from halfcast.contracts.status import FailureReason
from trainer.errors import TrainerError

ALL_LINEAR = "all-linear"


def unmatched_targets(model: nn.Module, targets: list[str]) -> list[str]:
    """The entries of ``targets`` that match no module path of ``model``."""
    names = [name for name, _ in model.named_modules() if name]
    return [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]


def apply_lora(model: nn.Module, adapter: AdapterSpec, config: HFConfig) -> nn.Module:
    """``model`` wrapped by ``peft.get_peft_model`` with ``adapter``'s LoRA; only adapters (and a
    classification head: PEFT's ``modules_to_save`` for ``SEQ_CLS``) train.

    Raises ``spec_invalid`` naming each ``target_modules`` entry that matches no module, or PEFT's
    refusal (e.g. a target that is no Linear/Embedding/Conv).
    """
    from peft import LoraConfig, TaskType, get_peft_model

    targets = adapter.target_modules
    if targets != ALL_LINEAR:
        missing = unmatched_targets(model, list(targets))
        if missing:
            raise TrainerError(
                FailureReason.SPEC_INVALID, f"adapter target_modules {missing} match no module of the model"
            )
    task_type = TaskType.CAUSAL_LM if config.task == "causal_lm" else TaskType.SEQ_CLS
    lora = LoraConfig(
        r=adapter.r,
        lora_alpha=adapter.alpha,  # type: ignore[arg-type]  # peft annotates int; it scales by lora_alpha / r
        lora_dropout=adapter.dropout,
        task_type=task_type,
        target_modules=targets if targets == ALL_LINEAR else list(targets),
    )
    try:
        return get_peft_model(model, lora)
    except (ValueError, TypeError) as exc:
        raise TrainerError(FailureReason.SPEC_INVALID, f"cannot apply the LoRA adapter: {exc}") from exc


def cast_frozen(model: nn.Module, dtype: torch.dtype) -> int:
    """Cast every frozen floating-point parameter of ``model`` to ``dtype`` in place; return how many.

    Trainable parameters and buffers (e.g. rotary frequencies) keep their dtype.
    """
    count = 0
    with torch.no_grad():
        for param in model.parameters():
            if not param.requires_grad and param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)
                count += 1
    return count


def check_trainable(model: nn.Module) -> None:
    """Every trainable parameter is float32 (master weights); raises ``spec_invalid`` if none trains."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise TrainerError(FailureReason.SPEC_INVALID, "the adapter leaves no trainable parameter")
    for param in trainable:
        if param.dtype != torch.float32:
            param.data = param.data.float()
