"""Who spends this host's CPU over a window, by role: the API, the worker, its runs, PostgreSQL, the load generator.

The API load bench beside real training (issue 31) asks what the pollers cost the training;
the answer is the CPU that the API, PostgreSQL and the pollers take while the runs want
every core. :func:`cpu_by_pid` reads every process's CPU seconds from ``/proc``, and
:meth:`RoleMap.split` puts the difference between two readings under its :class:`Role`:
the API's and the worker's process trees by ancestry (the worker's descendants are its
runs: launchers, the warm standby and the ranks), PostgreSQL by process name, the bench's
own tree (its poller processes) as the load generator, and the rest of the host as other.
A process that started inside the window counts from zero; one that ended is not counted.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


class Role(StrEnum):
    """What a process on the host is, for the bench."""

    API = "api"
    WORKER = "worker"
    RUNS = "runs"
    POSTGRES = "postgres"
    LOAD = "load generator"
    OTHER = "other"


@dataclass(frozen=True)
class Reading:
    """CPU seconds (user + system) by pid, with each pid's parent and name, and the wall clock."""

    cpu_s: Mapping[int, float]
    parent: Mapping[int, int]
    name: Mapping[int, str]
    wall_s: float


def cpu_by_pid(proc: Path = Path("/proc")) -> Reading:
    """Every process's CPU seconds now, from Linux's ``/proc/<pid>/stat`` (processes that vanish while read are left out)."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu_s: dict[int, float] = {}
    parent: dict[int, int] = {}
    name: dict[int, str] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        pid = int(entry.name)
        comm, _, rest = stat.partition(" (")[2].rpartition(") ")
        fields = rest.split()  # fields[0] is the state, [1] the parent's pid, [11] utime, [12] stime (in ticks)
        cpu_s[pid] = (int(fields[11]) + int(fields[12])) / tick
        parent[pid] = int(fields[1])
        name[pid] = comm
    return Reading(cpu_s, parent, name, time.monotonic())


@dataclass(frozen=True)
class RoleMap:
    """The pids whose trees have a role: the API's, the worker's (``None``: no worker) and the bench's."""

    api: int
    worker: int | None = None
    bench: int = field(default_factory=os.getpid)

    def role(self, pid: int, reading: Reading) -> Role:
        """The role of ``pid``: by the nearest ancestor with one (itself included), else by its name."""
        roots = {self.api: Role.API, self.bench: Role.LOAD}
        seen = set()
        current = pid
        while current and current not in seen:
            seen.add(current)
            if current == self.worker:
                return Role.WORKER if current == pid else Role.RUNS
            if current in roots:
                return roots[current]
            current = reading.parent.get(current, 0)
        return Role.POSTGRES if reading.name.get(pid, "").startswith("postgres") else Role.OTHER

    def split(self, before: Reading, after: Reading) -> dict[Role, float]:
        """Cores used by each role between the two readings (CPU seconds over wall seconds)."""
        wall_s = max(after.wall_s - before.wall_s, 1e-9)
        cores = dict.fromkeys(Role, 0.0)
        for pid, cpu_s in after.cpu_s.items():
            cores[self.role(pid, after)] += (cpu_s - before.cpu_s.get(pid, 0.0)) / wall_s
        return cores
