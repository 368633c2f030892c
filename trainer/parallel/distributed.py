"""Ranks, process group and device of one trainer process.

Under ``torchrun`` the environment carries ``RANK``, ``LOCAL_RANK`` and
``WORLD_SIZE``; a plain ``python -m trainer`` (or a test calling the loop in-process)
has none of them and runs as the single rank 0 of a world of size 1 without a
process group. A process group (gloo on CPU, NCCL on CUDA) is initialised only when
the world size is above 1.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from halfcast.contracts.spec import JobSpec
from halfcast.contracts.status import FailureReason
from trainer.errors import TrainerError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job.

    ``rank`` is the global rank in ``[0, world_size)``, ``local_rank`` the rank on this
    host (it picks the CUDA device), ``device`` the device the model lives on.
    """

    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """True on rank 0, the rank that writes records and checkpoints."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """True when a process group is initialised (collectives are needed)."""
        return dist.is_available() and dist.is_initialized()


def env_ranks() -> tuple[int, int, int]:
    """``(rank, local_rank, world_size)`` from the torchrun environment; ``(0, 0, 1)`` without it.

    Raises :class:`TrainerError` (``launch_failed``) for malformed or inconsistent values.
    """
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", rank)
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size < 1 or not 0 <= rank < world_size or local_rank < 0:
        msg = f"inconsistent torchrun environment: RANK={rank} LOCAL_RANK={local_rank} WORLD_SIZE={world_size}"
        raise TrainerError(FailureReason.LAUNCH_FAILED, msg)
    return rank, local_rank, world_size


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    try:
        return default if raw is None else int(raw)
    except ValueError as exc:
        raise TrainerError(FailureReason.LAUNCH_FAILED, f"malformed torchrun environment: {name}={raw!r}") from exc


def select_device(gpus: int, local_rank: int, local_world_size: int = 1) -> torch.device:
    """``cuda:<local_rank>`` when the job asks for GPUs, else ``cpu``.

    Raises :class:`TrainerError` (``gpu_unavailable``) when ``gpus > 0`` but CUDA is not
    available or this host has fewer devices than the ranks it runs
    (``local_world_size``) or none for ``local_rank``.
    """
    if gpus <= 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise TrainerError(FailureReason.GPU_UNAVAILABLE, f"the job asks for {gpus} GPU(s) but CUDA is not available")
    count = torch.cuda.device_count()
    if count < local_world_size or local_rank >= count:
        msg = f"the job runs {local_world_size} rank(s) with one GPU each on this host, which has {count} GPU(s)"
        raise TrainerError(FailureReason.GPU_UNAVAILABLE, msg)
    return torch.device("cuda", local_rank)


def init_distributed(spec: JobSpec) -> DistContext:
    """Read the ranks, pick the device and, for a world size above 1, join the process group.

    The process group uses ``env://`` rendezvous (set by torchrun), with the gloo
    backend on CPU and NCCL on CUDA, and the spec's ``distributed.timeout_s`` as its timeout. Raises
    :class:`TrainerError`: ``launch_failed``
    when the launched world size differs from ``spec.world_size``; ``gpu_unavailable``
    (see :func:`select_device`).
    """
    rank, local_rank, world_size = env_ranks()
    if world_size != spec.world_size:
        msg = f"the job needs {spec.world_size} rank(s) but was launched with {world_size}"
        raise TrainerError(FailureReason.LAUNCH_FAILED, msg)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", world_size)
    device = select_device(spec.gpus, local_rank, local_world_size)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        device_id = device if device.type == "cuda" else None
        timeout = timedelta(seconds=spec.effective_distributed.timeout_s)
        dist.init_process_group(backend=backend, init_method="env://", device_id=device_id, timeout=timeout)
        node_rank = os.environ.get("GROUP_RANK", "0")  # torchrun's node rank of this rank's agent
        log.info(
            "joined process group: backend=%s rank=%d world_size=%d node_rank=%s", backend, rank, world_size, node_rank
        )
    return DistContext(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def destroy_distributed() -> None:
    """Leave the process group if one is initialised; a no-op otherwise."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def distributed_session(spec: JobSpec) -> Iterator[DistContext]:
    """:func:`init_distributed` on entry, :func:`destroy_distributed` on exit (also on error).

    On a normal exit every rank first meets at a barrier, then in the launcher's store
    (:func:`leave_together`): a rank that tore its process group down while another was still
    inside its last collective made gloo abort that rank ("terminate called without an active
    exception", SIGABRT) after a successful run. After an error there is neither: the other
    ranks may never arrive.
    """
    try:
        context = init_distributed(spec)
        yield context
        barrier()
        leave_together(context.world_size, spec.effective_distributed.timeout_s)
    finally:
        destroy_distributed()


#: Key, in the launcher's store, that counts the ranks done with their last collective.
EXIT_KEY = "halfcast/exit"


def leave_together(world_size: int, timeout_s: float) -> None:
    """Wait, in the launcher's store rather than in gloo, until every rank returned from its last barrier.

    gloo's barrier returns on a rank once it has heard from every other, while a peer may still
    be finishing its own last exchange; a rank that closes its connections then can abort that
    peer. Once every rank has counted itself here, no rank has a collective in flight. The store
    is the one torchrun's agent (or the warm launcher) hosts at ``MASTER_ADDR:MASTER_PORT``; a
    no-op for one rank or where there is none, and a warning (not a failure: the run is complete)
    when it cannot be reached.
    """
    address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if world_size <= 1 or not address or not port.isdigit():
        return
    run = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    key = f"{EXIT_KEY}/{run}"
    try:
        store = dist.TCPStore(address, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))
        if store.add(key, 1) == world_size:
            store.set(f"{key}/all", "1")
        store.wait([f"{key}/all"])
    except (RuntimeError, OSError) as exc:  # DistStoreError is a RuntimeError
        log.warning("could not meet the other ranks in the launcher's store before leaving: %s", exc)


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum ``values`` (any shape, on the collective's device) over ranks, in place; returned for chaining.

    Without a process group this returns ``values`` unchanged.
    """
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def barrier() -> None:
    """Wait for every rank; a no-op without a process group."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def gather_to_main(value: Any, dist_ctx: DistContext) -> list[Any]:
    """Every rank's picklable ``value``, indexed by rank, on rank 0 (``[]`` on the others).

    Without a process group this is ``[value]``. A collective: every rank must call it.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    gathered: list[Any] | None = [None] * dist_ctx.world_size if dist_ctx.is_main else None
    dist.gather_object(value, gathered, dst=0)
    return gathered or []


def broadcast_from_main(values: torch.Tensor) -> torch.Tensor:
    """Replace ``values`` (on the collective's device) with rank 0's, in place; returned for chaining.

    Without a process group this returns ``values`` unchanged. A collective: every rank must call it.
    """
    if dist.is_available() and dist.is_initialized():
        dist.broadcast(values, src=0)
    return values
