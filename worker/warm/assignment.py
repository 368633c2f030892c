"""What the worker hands a standby (one run's command, directory and environment) and what it answers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: The only rank module a standby runs: the one it has imported.
TRAINER_MODULE = "trainer"
#: The rank wrapper of a cold command (:data:`worker.launch.process_tree.RANK_WRAPPER`), whose arguments a standby takes over.
RANK_WRAPPER = "worker.launch.rank_output"


class GangSeat(BaseModel):
    """Where one node of a multi-node run sits: torchrun's ``--nnodes``, ``--node-rank``, ``--rdzv-id`` and the
    static rendezvous ``--rdzv-endpoint`` (node 0's address and the port its worker reserved, :mod:`worker.gang.ports`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nodes: int = Field(ge=2)
    node_rank: int = Field(ge=0)
    endpoint_host: str = Field(min_length=1)
    endpoint_port: int = Field(gt=0, lt=65536)
    run_id: str = Field(min_length=1)

    @model_validator(mode="after")
    def _rank_in_gang(self) -> GangSeat:
        if self.node_rank >= self.nodes:
            raise ValueError(f"node_rank {self.node_rank} is not below nodes {self.nodes}")
        return self


class Assignment(BaseModel):
    """One run for a standby: ``processes`` ranks of ``python -m trainer ARGS`` in ``run_dir``, on one node
    (``gang`` ``None``) or as node ``gang.node_rank`` of a multi-node run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_dir: Path
    logs_dir: Path
    launcher_log: Path
    processes: int = Field(ge=1)
    trainer_args: tuple[str, ...]
    env: dict[str, str]
    gang: GangSeat | None = None

    @property
    def world_size(self) -> int:
        """Ranks in the whole run, every node's."""
        return self.processes * (self.gang.nodes if self.gang else 1)

    @property
    def first_rank(self) -> int:
        """The global rank of this node's local rank 0 (torchrun's: ``node_rank * nproc_per_node``)."""
        return self.processes * (self.gang.node_rank if self.gang else 0)


@dataclass(frozen=True)
class WarmCommand:
    """What a standby needs of a cold torchrun command of the trainer: ranks per node, logs, trainer arguments, seat."""

    processes: int
    logs_dir: Path
    trainer_args: tuple[str, ...]
    gang: GangSeat | None = None


def warm_command_parts(command: list[str]) -> WarmCommand | None:
    """The :class:`WarmCommand` of a torchrun command of the trainer, else ``None``.

    The command is :func:`worker.launch.process_tree.build_command`'s (``... --nnodes 1 --nproc-per-node P
    -m worker.launch.rank_output LOGS trainer ARGS...``) or one node's of a multi-node job
    (:func:`worker.gang.launch.gang_command`: ``--nnodes N --node-rank K`` and the static rendezvous). Any
    other shape (another module, another rendezvous backend, a command a test built) is left to the cold path.
    """
    try:
        wrapper = command.index(RANK_WRAPPER)
        launcher = command[:wrapper]
        nodes = int(_flag(launcher, "--nnodes"))
        processes = int(_flag(launcher, "--nproc-per-node"))
    except (ValueError, IndexError):
        return None
    if processes < 1 or command[wrapper - 1] != "-m" or len(command) < wrapper + 3:
        return None
    if command[wrapper + 2] != TRAINER_MODULE:
        return None
    gang = None
    if nodes != 1:
        gang = _gang_seat(launcher, nodes)
        if gang is None:
            return None
    return WarmCommand(processes, Path(command[wrapper + 1]), tuple(command[wrapper + 3 :]), gang)


def _flag(command: list[str], name: str) -> str:
    """The value after flag ``name`` (``ValueError`` or ``IndexError`` when it is missing)."""
    return command[command.index(name) + 1]


def _gang_seat(launcher: list[str], nodes: int) -> GangSeat | None:
    """The seat of a static-rendezvous multi-node command's node, ``None`` for any other rendezvous."""
    try:
        if _flag(launcher, "--rdzv-backend") != "static":
            return None
        host, _, port = _flag(launcher, "--rdzv-endpoint").rpartition(":")
        return GangSeat(
            nodes=nodes,
            node_rank=int(_flag(launcher, "--node-rank")),
            endpoint_host=host.removeprefix("[").removesuffix("]"),
            endpoint_port=int(port),
            run_id=_flag(launcher, "--rdzv-id"),
        )
    except (ValueError, IndexError):  # a pydantic ValidationError is a ValueError
        return None


class LauncherReport(BaseModel):
    """A standby's answer, one JSON line on its stdout: a launcher it forked ``started``, or ``exited`` with a status.

    ``exitcode`` is ``Popen.returncode``'s: the exit status, or minus the signal that killed it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    event: Literal["started", "exited"]
    pid: int = Field(gt=0)
    exitcode: int | None = None
