"""What the worker hands a standby (one run's command, directory and environment) and what it answers."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: The only rank module a standby runs: the one it has imported.
TRAINER_MODULE = "trainer"
#: The rank wrapper of a cold command (:data:`worker.launch.process_tree.RANK_WRAPPER`), whose arguments a standby takes over.
RANK_WRAPPER = "worker.launch.rank_output"


class Assignment(BaseModel):
    """One run for a standby: ``world_size`` ranks of ``python -m trainer ARGS`` in ``run_dir``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_dir: Path
    logs_dir: Path
    launcher_log: Path
    world_size: int = Field(ge=1)
    trainer_args: tuple[str, ...]
    env: dict[str, str]


def warm_command_parts(command: list[str]) -> tuple[int, Path, tuple[str, ...]] | None:
    """``(processes, logs_dir, trainer args)`` of a single-node torchrun command of the trainer, else ``None``.

    The command is :func:`worker.launch.process_tree.build_command`'s: ``... --nnodes 1 --nproc-per-node P
    -m worker.launch.rank_output LOGS trainer ARGS...``. Any other shape (another module, several
    nodes, a command a test built) is left to the cold path.
    """
    try:
        wrapper = command.index(RANK_WRAPPER)
        nodes = command[command.index("--nnodes") + 1]
        processes = int(command[command.index("--nproc-per-node") + 1])
    except (ValueError, IndexError):
        return None
    if nodes != "1" or command[wrapper - 1] != "-m" or len(command) < wrapper + 3:
        return None
    if command[wrapper + 2] != TRAINER_MODULE:
        return None
    return processes, Path(command[wrapper + 1]), tuple(command[wrapper + 3 :])


class LauncherReport(BaseModel):
    """A standby's answer, one JSON line on its stdout: a launcher it forked ``started``, or ``exited`` with a status.

    ``exitcode`` is ``Popen.returncode``'s: the exit status, or minus the signal that killed it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    event: Literal["started", "exited"]
    pid: int = Field(gt=0)
    exitcode: int | None = None
