"""Entry point: ``python -m trainer --spec SPEC.json --run-dir DIR [--resume-from CKPT]`` (directly or under torchrun).

Exit status 0 on success; :data:`trainer.preemption.STOPPED_EXIT` (143) after a
SIGTERM stop that wrote its checkpoint (:mod:`trainer.preemption`), at once: the
process ends without the interpreter's teardown (:func:`trainer.preemption.exit_now`),
so the worker sees the rank gone as soon as its checkpoint is on disk. A typed failure (:class:`trainer.errors.TrainerError`, or
``PrecisionUnsupportedError`` as ``precision_unsupported``, ``torch.OutOfMemoryError`` or
``MemoryError`` as ``oom``, or a spec that does not validate as ``spec_invalid``) writes ``<run_dir>/error.json``
``{"reason", "message", "rank"}`` and exits with :data:`TYPED_FAILURE_EXIT`; any other
exception propagates (non-zero exit; the worker reports ``rank_failed``).

Debugging aid: with ``HALFCAST_DUMP_PARAMS=1`` every rank writes its final parameters
to ``<run_dir>/params-rank<r>.pt``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from pydantic import ValidationError

from halfcast.contracts.error_file import ErrorFile
from halfcast.contracts.rundir import RunDir
from halfcast.contracts.spec import JobSpec
from halfcast.contracts.status import FailureReason
from trainer.errors import TrainerError
from trainer.numerics.precision import PrecisionUnsupportedError
from trainer.parallel.distributed import distributed_session
from trainer.preemption import STOPPED_EXIT, StopRequested, StopSignal, exit_now
from trainer.run.loop import train

log = logging.getLogger("trainer")

TYPED_FAILURE_EXIT = 3
DUMP_PARAMS_ENV = "HALFCAST_DUMP_PARAMS"
#: The worker sets it to ``1`` only when its settings allow fault injection; a spec with a
#: ``faults`` block is refused otherwise (defence in depth behind the API's 422).
ALLOW_FAULTS_ENV = "HALFCAST_ALLOW_FAULTS"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer", description="Run one Halfcast training job.")
    parser.add_argument("--spec", type=Path, required=True, help="job spec JSON file")
    parser.add_argument("--run-dir", type=Path, required=True, help="run directory (records, checkpoints)")
    parser.add_argument("--resume-from", type=Path, default=None, help="checkpoint to continue from exactly")
    return parser.parse_args(argv)


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def load_spec(path: Path) -> JobSpec:
    """Parse and validate the spec file; raises :class:`TrainerError` (``spec_invalid``)."""
    try:
        return JobSpec.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as exc:
        raise TrainerError(FailureReason.SPEC_INVALID, f"cannot load job spec {path}: {exc}") from exc


def write_error(run_dir: Path, reason: FailureReason, message: str, rank: int) -> None:
    """Write ``error.json`` (:class:`~halfcast.contracts.error_file.ErrorFile`) atomically (ranks failing together never tear
    it)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = RunDir(run_dir).error
    tmp = path.with_name(f".{path.name}.rank{rank}.tmp")
    error = ErrorFile(reason=reason, message=message, rank=rank)
    tmp.write_text(json.dumps(error.model_dump(mode="json")), encoding="utf-8")
    os.replace(tmp, path)


def run(spec_path: Path, run_dir: Path, resume_from: Path | None = None) -> None:
    """Load the spec, join the job's ranks, train (from ``resume_from`` if given); optionally dump parameters."""
    spec = load_spec(spec_path)
    if spec.faults is not None and os.environ.get(ALLOW_FAULTS_ENV) != "1":
        raise TrainerError(
            FailureReason.SPEC_INVALID, f"the spec has a faults block but fault injection is off ({ALLOW_FAULTS_ENV}=1)"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume_from is not None and not resume_from.is_file():
        raise TrainerError(FailureReason.SPEC_INVALID, f"checkpoint to resume from does not exist: {resume_from}")
    with distributed_session(spec) as dist_ctx:
        result = train(spec, run_dir, dist_ctx, resume_from, stop=StopSignal().install())
        if os.environ.get(DUMP_PARAMS_ENV) == "1":
            params = {name: t.detach().cpu() for name, t in result.model.state_dict().items()}
            torch.save(params, run_dir / f"params-rank{dist_ctx.rank}.pt")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job; return the process exit status (0, or :data:`TYPED_FAILURE_EXIT`)."""
    args = _parse(argv)
    rank = _rank()
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        run(args.spec, args.run_dir, args.resume_from)
    except StopRequested as stopped:
        log.warning("%s", stopped)
        return STOPPED_EXIT
    except TrainerError as exc:
        reason, message = exc.reason, exc.message
    except PrecisionUnsupportedError as exc:
        reason, message = FailureReason.PRECISION_UNSUPPORTED, str(exc)
    except (torch.OutOfMemoryError, MemoryError) as exc:
        reason, message = FailureReason.OOM, f"out of memory: {exc}"
    else:
        return 0
    log.error("job failed: %s: %s", reason, message)
    write_error(args.run_dir, reason, message, rank)
    return TYPED_FAILURE_EXIT


if __name__ == "__main__":
    exit_now(main())  # the work is on disk: no interpreter teardown (seconds, and gloo's threads still alive)
