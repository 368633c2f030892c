"""``keep_best``: the best evaluated state in ``checkpoints/best.pt``, and exports made from it.

Rank 0 writes ``best.pt`` (a full checkpoint, atomically, like every other: :mod:`trainer.run.checkpoint`)
at each evaluation that improves on the best so far (:mod:`trainer.run.early_stopping`); a file, not a
copy in memory, so a full fine-tune costs no host memory and the best state survives a restart.
On a resume the run starts in a new run directory, so the ``best.pt`` beside the resumed checkpoint
is copied over when it holds the step the checkpoint's tracker names (:func:`carry_best`). At the
end, :func:`best_model_state` gives its model weights, which the exports are made from.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from halfcast.contracts.rundir import BEST_CHECKPOINT, RunDir

if TYPE_CHECKING:
    from trainer.run.checkpoint import CheckpointPayload

log = logging.getLogger(__name__)


def best_path(run_dir: Path) -> Path:
    """``<run_dir>/checkpoints/best.pt`` (:class:`halfcast.contracts.rundir.RunDir`)."""
    return RunDir(run_dir).best_checkpoint


def _step_of(path: Path) -> int | None:
    if not path.is_file():
        return None
    return int(torch.load(path, map_location="cpu", weights_only=True)["step"])


def carry_best(resumed: Path, run_dir: Path, best_step: int | None) -> None:
    """Copy the ``best.pt`` beside the checkpoint ``resumed`` into ``run_dir`` if it holds ``best_step``."""
    source, target = resumed.parent / BEST_CHECKPOINT, best_path(run_dir)
    if best_step is None or source == target or _step_of(source) != best_step:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{BEST_CHECKPOINT}.carry.tmp")
    shutil.copyfile(source, tmp)
    tmp.replace(target)
    log.info("best checkpoint (step %d) carried over from %s", best_step, source)


def best_model_state(
    run_dir: Path, best_step: int | None, last_step: int
) -> tuple[int, dict[str, Any] | None]:  # open mapping: a torch state_dict
    """``(step, model state)`` of ``best.pt`` when it holds ``best_step`` (not the last step), else
    ``(last_step, None)``: export the last state (logged when ``best.pt`` is missing or holds another step)."""
    path = best_path(run_dir)
    if best_step is None or best_step == last_step:
        return last_step, None
    payload: CheckpointPayload | None = (
        torch.load(path, map_location="cpu", weights_only=True) if path.is_file() else None
    )
    if payload is None or int(payload["step"]) != best_step:
        log.warning(
            "no best checkpoint of step %s in %s: exporting the last state (step %d)", best_step, path, last_step
        )
        return last_step, None
    log.info("exporting the best evaluated state, step %d (%s)", best_step, path)
    return best_step, payload["model"]
