"""How many processes the kernel's OOM killer has killed, from this worker's view.

A rank killed by the OOM killer just dies of SIGKILL; the only trace is a counter:
``oom_kill`` in the cgroup's ``memory.events`` (cgroup v2) or ``memory.oom_control``
(cgroup v1), else the system-wide ``oom_kill`` of ``/proc/vmstat``. The worker reads
it before launching a run and after the run exits: a rank that died of SIGKILL (not
sent by the worker) while the count rose is reported as ``oom``.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


def oom_kill_count() -> int | None:
    """The ``oom_kill`` count of this process's memory cgroup (or of the system); ``None`` if unknown."""
    for path in _candidates():
        count = _read_counter(path)
        if count is not None:
            return count
    return None


def _candidates() -> list[Path]:
    v2_path = v1_path = ""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            if hierarchy == "0" and controllers == "":
                v2_path = path.lstrip("/")
            elif "memory" in controllers.split(","):
                v1_path = path.lstrip("/")
    except (OSError, ValueError):
        pass
    return [
        CGROUP_ROOT / v2_path / "memory.events",
        CGROUP_ROOT / "memory.events",
        CGROUP_ROOT / "memory" / v1_path / "memory.oom_control",
        CGROUP_ROOT / "memory" / "memory.oom_control",
        Path("/proc/vmstat"),
    ]


def _read_counter(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None
