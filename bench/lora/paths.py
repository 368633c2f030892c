"""The hand-written PEFT + ``torch.amp`` loop and Halfcast's own step, on the LoRA workload.

The hand loop is :class:`bench.peers.hand.HandLoop` (the PyTorch AMP recipe, LR schedule held on
a skipped fp16 step by reading the scale) around ``get_peft_model`` of the ``from_pretrained``
model; Halfcast is :class:`bench.peers.halfcast.HalfcastRunner` on the ``hf`` + LoRA job spec,
built by ``build_components`` (the real loader reading the model root, PEFT through
:mod:`trainer.hf.adapters`, the :class:`trainer.hf.wrapper.HFModule` wrapper, the real flusher).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from bench.lora_workload import MODEL_NAME, LoraWorkload, job_spec, mean_token_loss, model_roots, peer_model
from bench.peers.halfcast import HalfcastRunner
from bench.peers.hand import HandLoop
from trainer.data import Batch


def causal_lm_loss(model: Callable[..., Any], batch: Batch) -> torch.Tensor:
    """Mean next-token loss of a Hugging Face causal LM on ``batch`` (targets already shifted)."""
    logits = model(input_ids=batch.inputs, attention_mask=batch.attention_mask).logits
    return mean_token_loss(logits, batch.targets)


def hand_lora(work: LoraWorkload, root: Path) -> HandLoop:
    """The hand loop: PEFT LoRA on the float32 base, ``torch.autocast``, ``GradScaler`` for fp16."""
    import peft
    import transformers

    model = peer_model(work, root / MODEL_NAME)
    version = f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}"
    return HandLoop(model, work, causal_lm_loss, version=version)


def halfcast_lora(work: LoraWorkload, root: Path) -> HalfcastRunner:
    """Halfcast's step on the ``hf`` + LoRA job of ``work`` (frozen base float32, like the peers),
    its model loaded from the model root ``root``."""
    with model_roots(root):
        return HalfcastRunner(job_spec(replace(work, base_dtype="fp32")))


def halfcast_compute_lora(work: LoraWorkload, root: Path) -> HalfcastRunner:
    """Halfcast with its bf16/fp16 default ``base_dtype: compute``: frozen base weights stored in the
    compute dtype (no per-step cast of them; half their memory)."""
    with model_roots(root):
        runner = HalfcastRunner(job_spec(replace(work, base_dtype="compute")))
    runner.info.label = "Halfcast, base in compute dtype"
    return runner
