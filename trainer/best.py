"""``keep_best``: the best evaluated state in ``checkpoints/best.pt``, and exports made from it.

Rank 0 writes ``best.pt`` (a full checkpoint, atomically, like every other: :mod:`trainer.checkpoint`)
at each evaluation that improves on the best so far (:mod:`trainer.early_stopping`); a file, not a
copy in memory, so a full fine-tune costs no host memory and the best state survives a restart.
On a resume the run starts in a new run directory, so the ``best.pt`` beside the resumed checkpoint
is copied over when it holds the step the checkpoint's tracker names (:func:`carry_best`). At the
end, :func:`load_best_model` loads its model weights into the model that the exports are made from.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch
from torch import nn

from trainer.checkpoint import CHECKPOINT_DIR

log = logging.getLogger(__name__)

BEST_NAME = "best.pt"


def best_path(run_dir: Path) -> Path:
    """``<run_dir>/checkpoints/best.pt``."""
    return run_dir / CHECKPOINT_DIR / BEST_NAME


def _step_of(path: Path) -> int | None:
    if not path.is_file():
        return None
    return int(torch.load(path, map_location="cpu", weights_only=True)["step"])


def carry_best(resumed: Path, run_dir: Path, best_step: int | None) -> None:
    """Copy the ``best.pt`` beside the checkpoint ``resumed`` into ``run_dir`` if it holds ``best_step``."""
    source, target = resumed.parent / BEST_NAME, best_path(run_dir)
    if best_step is None or source == target or _step_of(source) != best_step:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{BEST_NAME}.carry.tmp")
    shutil.copyfile(source, tmp)
    tmp.replace(target)
    log.info("best checkpoint (step %d) carried over from %s", best_step, source)


def load_best_model(model: nn.Module, run_dir: Path, best_step: int | None, last_step: int) -> int:
    """Load ``best.pt``'s model weights into ``model`` and return its step; ``last_step`` when it is missing
    or holds another step than ``best_step`` (logged: the model is left as it is)."""
    path = best_path(run_dir)
    if best_step is None or best_step == last_step:
        return last_step
    payload = torch.load(path, map_location="cpu", weights_only=True) if path.is_file() else None
    if payload is None or int(payload["step"]) != best_step:
        log.warning("no best checkpoint of step %s in %s: exporting the last state (step %d)", best_step, path, last_step)
        return last_step
    device = next(model.parameters()).device
    model.load_state_dict({k: v.to(device) for k, v in payload["model"].items()})
    log.info("exporting the best evaluated state, step %d (%s)", best_step, path)
    return best_step
