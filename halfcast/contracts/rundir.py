"""The run directory: every path the worker, the trainer and the API share (docs/architecture.md, "The run directory").

The worker gives each attempt of a job its own directory, ``<runs_dir>/<job_id>/attempt-<n>/``
(:class:`JobRuns`), holding (:class:`RunDir`):

- ``spec.json``: the validated job spec (the worker);
- ``records.jsonl``: the trainer's records, one JSON object a line (:mod:`halfcast.contracts.records`);
- ``error.json``: a typed failure, ``{"reason", "message", "rank"}`` (the failing rank);
- ``checkpoints/step-<N>.pt``, ``checkpoints/final.pt``, ``checkpoints/best.pt`` (trainer rank 0);
- ``logs/rank-<r>.log`` (each rank's stdout and stderr) and ``logs/launcher.log`` (torchrun's own);
- ``export/adapter/`` and ``export/model/`` (a successful ``hf`` job's exports).

Only this module spells these names; the trainer, the worker and the API take their paths from
it. Torch-free and import-light: the rank wrapper (:mod:`worker.launch.rank_output`) imports it in every
rank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

SPEC_FILE = "spec.json"
RECORDS_FILE = "records.jsonl"
ERROR_FILE = "error.json"
CHECKPOINTS_DIR = "checkpoints"
#: The checkpoint of a run that reached its last step (or the step early stopping ended it at).
FINAL_CHECKPOINT = "final.pt"
#: ``keep_best``: the checkpoint of the best evaluation so far.
BEST_CHECKPOINT = "best.pt"
LOGS_DIR = "logs"
#: torchrun's own stdout and stderr (its failure summary names the failing rank).
LAUNCHER_LOG = "launcher.log"
EXPORT_DIR = "export"

#: A checkpoint name the API lists and serves: ``final.pt`` or ``step-<N>.pt`` (N of at most 18 digits).
CHECKPOINT_NAME = r"^(final|step-[0-9]{1,18})\.pt$"
_STEP_CHECKPOINT = re.compile(r"step-([0-9]+)\.pt")
_ATTEMPT_DIR = re.compile(r"attempt-([0-9]{1,9})")


class ExportKind(StrEnum):
    """What an export holds: a PEFT ``adapter`` or a merged Hugging Face ``model``."""

    ADAPTER = "adapter"
    MODEL = "model"


def step_checkpoint_name(step: int) -> str:
    """``step-<step>.pt``."""
    return f"step-{step}.pt"


def checkpoint_step(name: str) -> int | None:
    """``N`` of a ``step-<N>.pt`` name; ``None`` for any other name."""
    match = _STEP_CHECKPOINT.fullmatch(name)
    return int(match.group(1)) if match else None


def rank_log_name(rank: int) -> str:
    """``rank-<rank>.log``. Raises ``ValueError`` for a negative rank."""
    if rank < 0:
        raise ValueError(f"a rank is >= 0, not {rank}")
    return f"rank-{rank}.log"


def attempt_number(name: str) -> int | None:
    """``n`` of an ``attempt-<n>`` directory name; ``None`` for any other name."""
    match = _ATTEMPT_DIR.fullmatch(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class RunDir:
    """One attempt's run directory at ``path`` and the paths in it (none is created here)."""

    path: Path

    @property
    def spec(self) -> Path:
        """``spec.json``."""
        return self.path / SPEC_FILE

    @property
    def records(self) -> Path:
        """``records.jsonl``."""
        return self.path / RECORDS_FILE

    @property
    def error(self) -> Path:
        """``error.json``."""
        return self.path / ERROR_FILE

    @property
    def checkpoints(self) -> Path:
        """``checkpoints/``."""
        return self.path / CHECKPOINTS_DIR

    def step_checkpoint(self, step: int) -> Path:
        """``checkpoints/step-<step>.pt``."""
        return self.checkpoints / step_checkpoint_name(step)

    @property
    def final_checkpoint(self) -> Path:
        """``checkpoints/final.pt``."""
        return self.checkpoints / FINAL_CHECKPOINT

    @property
    def best_checkpoint(self) -> Path:
        """``checkpoints/best.pt``."""
        return self.checkpoints / BEST_CHECKPOINT

    def step_checkpoints(self) -> list[tuple[int, Path]]:
        """``(N, path)`` of every ``checkpoints/step-<N>.pt`` file, by step (``[]`` without the folder)."""
        if not self.checkpoints.is_dir():
            return []
        found = ((checkpoint_step(path.name), path) for path in self.checkpoints.iterdir())
        return sorted((step, path) for step, path in found if step is not None and path.is_file())

    @property
    def logs(self) -> Path:
        """``logs/``."""
        return self.path / LOGS_DIR

    def rank_log(self, rank: int) -> Path:
        """``logs/rank-<rank>.log``. Raises ``ValueError`` for a negative rank."""
        return self.logs / rank_log_name(rank)

    def rank_logs(self) -> list[Path]:
        """Every ``logs/rank-<r>.log`` there is, by name."""
        return sorted(self.logs.glob("rank-*.log"))

    @property
    def launcher_log(self) -> Path:
        """``logs/launcher.log``."""
        return self.logs / LAUNCHER_LOG

    @property
    def export(self) -> Path:
        """``export/``."""
        return self.path / EXPORT_DIR

    def export_of(self, kind: ExportKind | str) -> Path:
        """``export/<kind>/``. Raises ``ValueError`` for a ``kind`` that is no :class:`ExportKind`."""
        return self.export / ExportKind(kind).value


@dataclass(frozen=True)
class JobRuns:
    """A job's folder of run directories, ``<runs_dir>/<job_id>/``, one ``attempt-<n>/`` per attempt."""

    path: Path

    @classmethod
    def of(cls, runs_dir: Path, job_id: str) -> JobRuns:
        """The folder of ``job_id`` under ``runs_dir``."""
        return cls(runs_dir / job_id)

    def attempt(self, number: int) -> RunDir:
        """The run directory of attempt ``number`` (1-based)."""
        return RunDir(self.path / f"attempt-{number}")

    def attempt_numbers(self) -> list[int]:
        """The numbers of the attempt directories there are, ascending (none: the job never started)."""
        if not self.path.is_dir():
            return []
        found = ((attempt_number(path.name), path) for path in self.path.iterdir())
        return sorted(number for number, path in found if number is not None and path.is_dir())
