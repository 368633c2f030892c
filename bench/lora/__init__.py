"""The LoRA benchmark's paths (issue 12 item 8): a hand PEFT + ``torch.amp`` loop, Halfcast, HF Trainer.

Each is built lazily by :func:`build_lora_runner` so ``transformers``/``peft`` load only when asked.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from bench.lora_workload import LoraWorkload
from bench.peers.base import Runner

#: Path name -> (module, factory taking the workload and the model root). ``hand`` is the reference.
LORA_PEERS: dict[str, tuple[str, str]] = {
    "hand": ("bench.lora.paths", "hand_lora"),
    "halfcast": ("bench.lora.paths", "halfcast_lora"),
    "trainer": ("bench.lora.hf_trainer", "TrainerRunner"),
    "halfcast-compute": ("bench.lora.paths", "halfcast_compute_lora"),
}


def build_lora_runner(name: str, work: LoraWorkload, root: Path) -> Runner:
    """Import and set up path ``name`` on ``work``, its model read from the model root ``root``."""
    module_name, factory_name = LORA_PEERS[name]
    factory = getattr(importlib.import_module(module_name), factory_name)
    return factory(work, root)
