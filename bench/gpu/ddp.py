"""The same checks under DDP: one process per GPU (``torch.multiprocessing.spawn``), NCCL.

Each rank joins ``init_process_group("nccl")`` (gloo on the CPU for ``--dry-run``, two
processes), runs :func:`bench.gpu.matrix.run_matrix` on its own shard of the data and writes its
rows to a file the parent reads back; tokens/s is reported per rank and summed per configuration.
With one GPU the report is ``skipped: one GPU``.
"""

from __future__ import annotations

import os
import socket
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from pydantic import TypeAdapter

from bench.gpu.matrix import run_matrix
from bench.gpu.results import DdpReport, PathResult, RowStatus
from bench.gpu.settings import CheckSettings
from trainer.parallel.distributed import DistContext

#: Ranks of a dry run's gloo DDP.
DRY_RUN_WORLD = 2
ROWS = TypeAdapter(list[PathResult])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_main(rank: int, world_size: int, port: int, settings_json: str, out_dir: str) -> None:
    """One spawned rank: join the group, run the checks, write ``rank<N>.json``."""
    settings = CheckSettings.model_validate_json(settings_json)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    device = torch.device("cpu") if settings.dry_run else torch.device("cuda", rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "gloo" if settings.dry_run else "nccl"
    dist.init_process_group(
        backend,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(minutes=5),
        device_id=device if device.type == "cuda" else None,
    )
    try:
        rows = run_matrix(settings, DistContext(rank=rank, local_rank=rank, world_size=world_size, device=device))
        Path(out_dir, f"rank{rank}.json").write_bytes(ROWS.dump_json(rows))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def total_tokens_per_s(rows: list[PathResult]) -> dict[str, float]:
    """``model/precision/path`` -> tokens/s summed over the ranks (configurations every rank ran ``ok``)."""
    totals: dict[str, list[float | None]] = {}
    for row in rows:
        totals.setdefault(f"{row.model}/{row.precision}/{row.path}", []).append(row.tokens_per_s)
    return {
        key: sum(v for v in values if v is not None)
        for key, values in totals.items()
        if all(v is not None for v in values)
    }


def run_ddp(settings: CheckSettings) -> DdpReport:
    """The DDP report: skipped on one GPU (or when turned off), else every rank's rows and the totals."""
    if not settings.ddp:
        return DdpReport(status=RowStatus.SKIPPED, reason="skipped: --no-ddp")
    world = DRY_RUN_WORLD if settings.dry_run else torch.cuda.device_count()
    if world < 2:
        return DdpReport(status=RowStatus.SKIPPED, reason="skipped: one GPU")
    backend = "gloo" if settings.dry_run else "nccl"
    with tempfile.TemporaryDirectory(prefix="gpu-checks-ddp-") as out_dir:
        try:
            mp.spawn(_rank_main, args=(world, _free_port(), settings.model_dump_json(), out_dir), nprocs=world)
        except Exception as exc:  # noqa: BLE001 - a rank's failure is the report's, the parent goes on
            return DdpReport(
                status=RowStatus.FAILED, reason=f"{type(exc).__name__}: {exc}", backend=backend, world_size=world
            )
        rows = [
            row for rank in range(world) for row in ROWS.validate_json(Path(out_dir, f"rank{rank}.json").read_bytes())
        ]
    failed = any(row.status is RowStatus.FAILED for row in rows)
    return DdpReport(
        status=RowStatus.FAILED if failed else RowStatus.OK,
        backend=backend,
        world_size=world,
        results=rows,
        total_tokens_per_s=total_tokens_per_s(rows),
    )
