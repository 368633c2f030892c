"""Random-number generators of one rank: seeded from the spec, captured into checkpoints, restored on resume.

Covers Python's ``random``, torch's CPU generator and, where CUDA is in use, every
CUDA device's generator (dropout and any other in-model randomness). Data order
does not depend on these: it is derived from the spec's seed and the epoch
(:func:`trainer.data.base.epoch_generator`).
"""

from __future__ import annotations

import random
from typing import Any, NotRequired, TypedDict

import torch
from torch import Tensor


class RngState(TypedDict):
    """One rank's generator states, as a checkpoint's ``rng`` holds them (by rank)."""

    #: ``random.getstate()`` (a ``torch.load`` round trip may give its tuples back as lists).
    python: tuple[Any, ...] | list[Any]
    torch: Tensor
    #: Every CUDA device's generator state; only where CUDA was in use.
    cuda: NotRequired[list[Tensor]]


def seed_everything(seed: int) -> None:
    """Seed Python's and torch's generators (CPU and every CUDA device)."""
    random.seed(seed)
    torch.manual_seed(seed)


def capture_rng_state() -> RngState:
    """This process's generator states (CPU tensors and Python objects; picklable)."""
    state: RngState = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: RngState) -> None:
    """Restore what :func:`capture_rng_state` returned (CUDA states only where CUDA is in use)."""
    random.setstate(_as_python_state(state["python"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_python_state(value: Any) -> tuple[Any, ...]:
    """``random.setstate`` wants tuples; a round trip through ``torch.load`` may give lists."""
    version, internal, gauss = value
    return (version, tuple(internal), gauss)
