"""Which GPUs a worker may hand to jobs: configured, inherited or discovered.

In order of precedence:

1. ``HALFCAST_WORKER_GPUS``: a comma-separated list of device indices (``"0,1,2,3"``),
   or ``"none"`` (also ``""``) for a CPU-only worker;
2. the worker's own ``CUDA_VISIBLE_DEVICES``, when set (its indices are the ones
   handed on: a job's ``CUDA_VISIBLE_DEVICES`` is built afresh, so it names host
   devices, not positions within the worker's list);
3. discovery: the ``GPU <n>:`` lines of ``nvidia-smi -L``, else
   ``torch.cuda.device_count()`` in a subprocess (ROCm hosts), else none.

Discovery never initialises CUDA in the worker process (a forked Celery child
must not hold a CUDA context, celery#6036): both probes run as subprocesses.
Indices follow CUDA's enumeration, which is how the child interprets them.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

#: Seconds a discovery probe may take before it counts as "no GPUs".
PROBE_TIMEOUT_S = 60.0
#: Spellings of "no GPUs" in ``HALFCAST_WORKER_GPUS`` and ``CUDA_VISIBLE_DEVICES``.
NONE_WORDS = frozenset({"", "none", "-1"})
_NVIDIA_SMI_LINE = re.compile(r"^GPU (\d+):", re.MULTILINE)
_TORCH_COUNT = "import torch; print(torch.cuda.device_count())"
#: Device nodes of the NVIDIA (CUDA), AMD (ROCm) and WSL GPU drivers.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")

Probe = Callable[[], list[int] | None]


def parse_gpu_list(text: str, source: str = "HALFCAST_WORKER_GPUS") -> list[int]:
    """Device indices from ``"0,1,3"`` (spaces allowed); ``[]`` for ``"none"``, ``""`` or ``"-1"``.

    Raises ``ValueError`` naming ``source`` for anything else: a negative or
    non-integer entry (e.g. a GPU UUID or MIG name, which cannot be handed out by
    index) or a repeated index.
    """
    cleaned = text.strip().lower()
    if cleaned in NONE_WORDS:
        return []
    indices: list[int] = []
    for entry in (part.strip() for part in cleaned.split(",")):
        if not entry.isdigit():
            raise ValueError(f"{source}={text!r}: {entry!r} is not a device index (use e.g. '0,1' or 'none')")
        indices.append(int(entry))
    if len(set(indices)) != len(indices):
        raise ValueError(f"{source}={text!r}: a device is listed twice")
    return indices


def nvidia_smi_gpus(timeout_s: float = PROBE_TIMEOUT_S) -> list[int] | None:
    """Indices of the devices ``nvidia-smi -L`` lists; ``None`` if it is absent or fails."""
    program = shutil.which("nvidia-smi")
    if program is None:
        return None
    try:
        result = subprocess.run([program, "-L"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("nvidia-smi -L failed: %s", exc)
        return None
    if result.returncode != 0:
        log.warning("nvidia-smi -L exited %d: %s", result.returncode, result.stderr.strip()[:500])
        return None
    return sorted(int(index) for index in _NVIDIA_SMI_LINE.findall(result.stdout))


def torch_gpus(
    timeout_s: float = PROBE_TIMEOUT_S, device_nodes: tuple[str, ...] = GPU_DEVICE_NODES
) -> list[int] | None:
    """``range(torch.cuda.device_count())`` computed in a subprocess; ``None`` if that fails.

    A host without any GPU driver device node (``device_nodes``) has no GPUs: ``[]`` at
    once, without paying a torch import in a subprocess (seconds) at every worker start.
    """
    if not any(os.path.exists(node) for node in device_nodes):
        return []
    try:
        result = subprocess.run(
            [sys.executable, "-c", _TORCH_COUNT], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("counting GPUs with torch failed: %s", exc)
        return None
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines or not lines[-1].isdigit():
        log.warning("counting GPUs with torch failed (exit %d): %s", result.returncode, result.stderr.strip()[-500:])
        return None
    return list(range(int(lines[-1])))


def discover_gpus(
    configured: str | None,
    environ: Mapping[str, str] | None = None,
    probes: tuple[Probe, ...] = (nvidia_smi_gpus, torch_gpus),
) -> list[int]:
    """The GPU indices this worker may hand out (see the module docstring for the order).

    ``configured`` is ``HALFCAST_WORKER_GPUS``; ``environ`` defaults to this
    process's environment. Raises ``ValueError`` for a malformed setting or
    ``CUDA_VISIBLE_DEVICES``. Never raises for a failed probe: the next one is
    tried, and without an answer the worker has no GPUs.
    """
    environ = os.environ if environ is None else environ
    if configured is not None:
        return parse_gpu_list(configured)
    inherited = environ.get("CUDA_VISIBLE_DEVICES")
    if inherited is not None:
        return parse_gpu_list(inherited, "CUDA_VISIBLE_DEVICES")
    for probe in probes:
        found = probe()
        if found is not None:
            return found
    return []
