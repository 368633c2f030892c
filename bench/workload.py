"""The shared workload: one MLP, one preloaded synthetic data set, one optimizer and LR schedule.

Every path trains the same thing: ``Linear(in, h1) -> ReLU -> ... -> Linear(h_k, classes)``
(:func:`trainer.models.mlp.build_mlp`) initialised from the same seed, on the same
in-memory micro-batches (Halfcast's seeded synthetic classification data, float32
``[B, in_features]`` inputs and int64 ``[B]`` targets), with AdamW, the same LR schedule
(:class:`trainer.optim.schedule.LRMultiplier`, cosine with linear warm-up) and gradient
clipping of the unscaled gradients to ``max_grad_norm``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any, Literal, Protocol

import torch
from torch import nn

from halfcast.contracts.spec import JobSpec
from trainer.data import Batch, build_dataset
from trainer.models.mlp import build_mlp
from trainer.optim.schedule import LRMultiplier

BenchPrecision = Literal["fp16", "bf16", "fp32"]

#: torch dtype autocast is asked for, per precision.
AUTOCAST_DTYPES: dict[str, torch.dtype] = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Workload:
    """What every path trains; sizes in features/classes, ``lr`` per step, ``max_grad_norm`` in L2 units.

    ``total_steps`` is the LR schedule's length (every step any path takes in one run
    should fit in it). ``log_interval``: Halfcast's steps per telemetry flush.
    """

    precision: BenchPrecision = "fp16"
    in_features: int = 256
    hidden_sizes: tuple[int, ...] = (512, 512)
    num_classes: int = 10
    micro_batch_size: int = 64
    num_batches: int = 16
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    max_grad_norm: float = 1.0
    total_steps: int = 10_000
    log_interval: int = 10
    seed: int = 0
    #: Every path compiles its model with its own option (``torch.compile``, ``compile: true``,
    #: Accelerate's ``dynamo_backend``, Fabric's compiled module).
    compile: bool = False

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype every path asks autocast for (``None`` for fp32: no autocast)."""
        return AUTOCAST_DTYPES.get(self.precision)


def job_spec(work: Workload, implementation: str = "fused") -> JobSpec:
    """The Halfcast :class:`JobSpec` for ``work`` (GradScaler's default dynamic loss scale for fp16)."""
    return JobSpec.model_validate(
        {
            "model": {"name": "mlp", "config": {"hidden_sizes": list(work.hidden_sizes)}},
            "dataset": {
                "name": "synthetic",
                "config": {
                    "task": "classification",
                    "in_features": work.in_features,
                    "num_classes": work.num_classes,
                    "num_samples": work.micro_batch_size * work.num_batches,
                    "seed": work.seed,
                },
            },
            "precision": work.precision,
            "micro_batch_size": work.micro_batch_size,
            "max_steps": work.total_steps,
            "optimizer": {
                "name": "adamw",
                "lr": work.lr,
                "weight_decay": work.weight_decay,
                "implementation": implementation,
            },
            "lr_scheduler": {"name": "cosine", "warmup_steps": work.warmup_steps, "min_lr_ratio": work.min_lr_ratio},
            "max_grad_norm": work.max_grad_norm,
            "log_interval": work.log_interval,
            "seed": work.seed,
            "compile": work.compile,
        }
    )


def make_batches(work: Workload) -> list[Batch]:
    """``num_batches`` CPU micro-batches of ``micro_batch_size`` samples, the first epoch of Halfcast's stream."""
    spec = job_spec(work)
    dataset = build_dataset(spec.dataset)
    stream: Iterator[Batch] = dataset.train_batches(work.micro_batch_size, rank=0, world_size=1, seed=work.seed)
    return list(islice(stream, work.num_batches))


def make_model(work: Workload) -> nn.Sequential:
    """The float32 MLP, initialised exactly as Halfcast's ``build_components`` does (same seed, same builder)."""
    torch.manual_seed(work.seed)
    return build_mlp(work.in_features, work.num_classes, work.hidden_sizes)


class OptimizerSettings(Protocol):
    """What the peers' optimizer and LR schedule are built from (:class:`Workload`, ``LoraWorkload``)."""

    # read-only (properties): the workloads are frozen
    @property
    def lr(self) -> float: ...
    @property
    def weight_decay(self) -> float: ...
    @property
    def warmup_steps(self) -> int: ...
    @property
    def min_lr_ratio(self) -> float: ...
    @property
    def total_steps(self) -> int: ...


def lr_multiplier(work: OptimizerSettings) -> LRMultiplier:
    """The LR factor after ``n`` applied steps: Halfcast's own closed form, for the peers' ``LambdaLR``."""
    return LRMultiplier(
        name="cosine", total_steps=work.total_steps, warmup_steps=work.warmup_steps, min_lr_ratio=work.min_lr_ratio
    )


def peer_optimizer(model: nn.Module, work: OptimizerSettings) -> torch.optim.AdamW:
    """PyTorch's fused AdamW over the trainable parameters (the kernel Halfcast's ``implementation="fused"`` calls)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(trainable, lr=work.lr, weight_decay=work.weight_decay, fused=True)


def peer_scheduler(optimizer: torch.optim.Optimizer, work: OptimizerSettings) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` with Halfcast's schedule: after ``k`` scheduler steps the factor is ``m(k)``."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(work))


def probed_module(model: nn.Module) -> nn.Module:
    """The first LoRA-wrapped layer of ``model`` (a module with ``lora_A``), else its first ``nn.Linear``."""
    modules = list(model.modules())
    lora = next((m for m in modules if hasattr(m, "lora_A") and hasattr(m, "base_layer")), None)
    return lora if lora is not None else next(m for m in modules if isinstance(m, nn.Linear))


class ActivationProbe:
    """Records the output dtype of :func:`probed_module` the next time ``model`` runs forward.

    This is what a path *really* computes in, whatever precision it was asked for.
    ``dtype`` is ``None`` until a forward pass ran; the hook removes itself after one call.
    """

    def __init__(self, model: nn.Module) -> None:
        self.dtype: torch.dtype | None = None
        self._handle = probed_module(model).register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        self.dtype = output[0].dtype if isinstance(output, tuple) else output.dtype
        self._handle.remove()

    @property
    def name(self) -> str:
        """``"float16"``, ``"bfloat16"``, ``"float32"``, or ``"unknown"`` before a forward pass."""
        return str(self.dtype).removeprefix("torch.") if self.dtype is not None else "unknown"
