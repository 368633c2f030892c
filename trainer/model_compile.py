"""``compile: true``: the training model through ``torch.compile``, compiled before the first step.

:func:`compile_model` wraps the (maybe DDP-wrapped) training model in ``torch.compile`` (Inductor,
graph breaks allowed: a Hugging Face model with PEFT compiles in pieces). Compilation is lazy in
PyTorch; :func:`warm_up` forces it before the job's ``start`` record, so the record can carry the
seconds it took (``compile_s``) and the first step's time is a step's: one forward and backward of
the first training micro-batch under the precision's autocast and loss scale, after which
everything the warm-up touched is put back exactly: gradients (``None`` again), buffers (running
statistics), and the CPU and CUDA random generators (dropout draws the same numbers as without the
warm-up). Every rank warms up together (under DDP the backward is a collective).

What does not compile is rejected by the spec (a 422 naming ``compile``): FSDP2 (sharded
parameters), and fp8 (its Linears record overflows in host-side state, a graph break at every
layer).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from trainer.data import Batch
from trainer.losses import LossFn
from trainer.numerics.precision import PrecisionPolicy

log = logging.getLogger(__name__)


def compile_model(model: nn.Module) -> nn.Module:
    """``torch.compile(model)`` (default Inductor backend, graph breaks allowed)."""
    return torch.compile(model)  # type: ignore[return-value]


def uncompiled(model: nn.Module) -> nn.Module:
    """The module inside a ``torch.compile`` wrapper, or ``model`` itself."""
    inner = getattr(model, "_orig_mod", None)
    return inner if isinstance(inner, nn.Module) else model


@contextmanager
def _restored(model: nn.Module) -> Iterator[None]:
    """Put gradients, buffers and the random generators back as they were on entry."""
    buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    cpu_rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        for parameter in model.parameters():
            parameter.grad = None
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        torch.random.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def warm_up(train_model: nn.Module, batch: Batch, precision: PrecisionPolicy, loss_fn: LossFn) -> float:
    """Compile ``train_model`` (a :func:`compile_model` result) on ``batch``: seconds it took.

    One forward and backward (``batch`` on the model's device), then the model's state is as before.
    """
    start = time.perf_counter()
    with _restored(uncompiled(train_model)):
        with precision.autocast():
            loss = loss_fn(train_model, batch)
        precision.backward(loss.float() / max(batch.num_elements, 1))
    seconds = time.perf_counter() - start
    log.info("compiled the model in %.1f s", seconds)
    return seconds
