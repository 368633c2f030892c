"""Seeded random data for tests: a linear teacher for regression or classification."""

from __future__ import annotations

import math

import torch

from halfcast.contracts.catalog import SyntheticConfig
from trainer.data.arrays import ArrayDataset
from trainer.data.base import DataInfo, Task

#: Held-out samples are one fifth of ``num_samples`` (at least one), drawn from the same teacher.
EVAL_FRACTION = 0.2


def build_synthetic(config: SyntheticConfig) -> ArrayDataset:
    """Inputs ``x`` float32 ``[N, in_features]`` from N(0, 1) and a teacher ``w`` from N(0, 1/in_features).

    Regression: targets float32 ``[N, out_features]`` = ``x @ w * target_scale + noise * e``
    with ``e`` from N(0, 1). Classification: targets int64 ``[N]`` =
    ``argmax(x @ w + noise * e)`` over ``num_classes``. Everything comes from one
    generator seeded by ``config.seed``; ``num_samples`` are for training and
    ``ceil(num_samples / 5)`` more are held out.
    """
    generator = torch.Generator().manual_seed(config.seed)
    classify = config.task == "classification"
    outputs = config.num_classes if classify else config.out_features
    num_eval = max(1, math.ceil(config.num_samples * EVAL_FRACTION))
    total = config.num_samples + num_eval
    teacher = torch.randn(config.in_features, outputs, generator=generator) / math.sqrt(config.in_features)
    x = torch.randn(total, config.in_features, generator=generator)
    signal = x @ teacher
    noise = config.noise * torch.randn(total, outputs, generator=generator)
    if classify:
        y = (signal + noise).argmax(dim=1)
        task = Task.CLASSIFICATION
    else:
        y = signal * config.target_scale + noise
        task = Task.REGRESSION
    n = config.num_samples
    return ArrayDataset(
        info=DataInfo(task=task, num_outputs=outputs, in_features=config.in_features),
        train_x=x[:n].contiguous(),
        train_y=y[:n].contiguous(),
        eval_x=x[n:].contiguous(),
        eval_y=y[n:].contiguous(),
    )
