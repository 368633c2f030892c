"""The held-out metrics of a classification job spec *before* training: its step-0 model.

Builds the job's components exactly as the trainer does (same tokenizer, data split and
seed, so the same freshly initialised classification head and untrained LoRA adapter),
evaluates them on the held-out set under the job's precision with the trainer's own
:func:`trainer.run.evaluate.evaluate`, and logs the loss and accuracy beside the majority-class
accuracy of that held-out set. Reads the same ``HALFCAST_MODEL_ROOTS`` and
``HALFCAST_DATA_ROOTS`` as the trainer.

Usage: ``python examples/untrained_accuracy.py examples/minilm-lora-bf16.json``.
"""

from __future__ import annotations

import argparse
import collections
import logging
from pathlib import Path

import torch

from halfcast.contracts.spec import JobSpec
from trainer.components import build_components
from trainer.data.base import Task
from trainer.parallel.distributed import DistContext
from trainer.run.evaluate import evaluate

log = logging.getLogger("untrained_accuracy")


def untrained_metrics(spec: JobSpec) -> dict[str, float]:
    """``evaluate``'s metrics of ``spec``'s step-0 model, plus ``majority_accuracy`` of its held-out labels."""
    parts = build_components(spec, DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu")))
    if parts.dataset.info.task is not Task.CLASSIFICATION:
        raise SystemExit(f"{spec.name}: not a classification job")
    metrics = evaluate(parts.model, parts.dataset, parts.precision, spec.micro_batch_size)
    labels = collections.Counter(
        int(batch.targets[i]) for batch in parts.dataset.eval_batches(256) for i in range(batch.num_samples)
    )
    metrics["majority_accuracy"] = max(labels.values()) / sum(labels.values())
    return metrics


def main(argv: list[str] | None = None) -> None:
    """Log the untrained metrics of the spec file given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path, help="job spec JSON file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    spec = JobSpec.model_validate_json(args.spec.read_text())
    metrics = untrained_metrics(spec)
    log.info("%s untrained (step 0): %s", spec.name, ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))


if __name__ == "__main__":
    main()
