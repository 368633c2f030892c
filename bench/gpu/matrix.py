"""Every model x precision x path on one rank; an error (a sync raising included) fails that row only."""

from __future__ import annotations

import logging
from collections.abc import Callable

from bench.gpu.halfcast_path import run_halfcast
from bench.gpu.hand_path import run_hand
from bench.gpu.results import PathResult, RowStatus
from bench.gpu.settings import CheckPrecision, CheckSettings, ModelKind, PathKind
from trainer.parallel.distributed import DistContext

log = logging.getLogger(__name__)

PathRunner = Callable[[ModelKind, CheckPrecision, CheckSettings, DistContext], PathResult]
RUNNERS: dict[PathKind, PathRunner] = {PathKind.HALFCAST: run_halfcast, PathKind.HAND: run_hand}


def run_one(
    model: ModelKind, precision: CheckPrecision, path: PathKind, settings: CheckSettings, ctx: DistContext
) -> PathResult:
    """One row; ``RuntimeError`` (CUDA's sync debug mode raises one naming the call) or any other error fails it."""
    try:
        return RUNNERS[path](model, precision, settings, ctx)
    except Exception as exc:
        log.exception("%s/%s/%s failed", model, precision, path)
        return PathResult(
            model=model,
            precision=precision,
            path=path,
            status=RowStatus.FAILED,
            reason=f"{type(exc).__name__}: {exc}",
            rank=ctx.rank,
            world_size=ctx.world_size,
        )


def run_matrix(settings: CheckSettings, ctx: DistContext) -> list[PathResult]:
    """Every configured model x precision x path, in that order."""
    return [
        run_one(model, precision, path, settings, ctx)
        for model in settings.models
        for precision in settings.precisions
        for path in settings.paths
    ]
