"""The launch file node 0 writes for the other nodes of its gang: ``<run_dir>/gang.json``.

Every rank of a resumed attempt must load the same checkpoint, and node 0 alone decides
which (the newest of the earlier attempts, :func:`worker.lifecycle.checkpoints.retry_checkpoint`, or the
spec's ``resume_from``). It writes its choice here before the gang launches; the run
directory is shared by the hosts, so each other node reads it before starting its torchrun.

Node 0 also decides how every node launches (:class:`GangLauncher`): forked from each worker's warm
standby (:mod:`worker.warm`) or by torchrun. The two do not mix: node 0's warm launcher hosts a bare
``env://`` store at the gang's endpoint, where torchrun's agents expect their rendezvous protocol.
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict

#: The launch file's name in the attempt's run directory.
GANG_FILE = "gang.json"
#: Seconds a node waits for its worker's warm standby to finish its imports before launching warm.
WARM_WAIT_S = 120.0


class GangLauncher(StrEnum):
    """How every node of the attempt starts its ranks."""

    WARM = "warm"  # forked from the node's warm standby (worker.warm.agent), node 0's launcher hosting the store
    TORCHRUN = "torchrun"  # torchrun's static rendezvous, node 0's agent hosting the store


class GangPlanFile(BaseModel):
    """What every node of the attempt launches with besides its own rank: the checkpoint to resume from, the launcher."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    resume_from: str | None = None
    launcher: GangLauncher = GangLauncher.TORCHRUN  # a file written before warm gangs: torchrun


def write_plan(run_dir: Path, resume_from: str | None, launcher: GangLauncher = GangLauncher.TORCHRUN) -> None:
    """Write the launch file atomically (a reader never sees half of it)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    temporary = run_dir / f".{GANG_FILE}.tmp"
    temporary.write_text(GangPlanFile(resume_from=resume_from, launcher=launcher).model_dump_json())
    os.replace(temporary, run_dir / GANG_FILE)


def read_plan(run_dir: Path) -> GangPlanFile:
    """The launch file node 0 wrote (raises ``FileNotFoundError`` or ``pydantic.ValidationError``)."""
    return GangPlanFile.model_validate_json((run_dir / GANG_FILE).read_text())
