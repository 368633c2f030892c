"""Helpers shared by the trainer tests: gloo process groups on localhost and a tiny causal LM with padding."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.data import IGNORE_INDEX, Batch
from trainer.data.base import token_batch
from trainer.models.gpt import GPT
from trainer.parallel.distributed import DistContext, barrier, leave_together
from trainer.preemption import exit_now
from trainer.records import read_records

CPU = torch.device("cpu")
#: The repository root (the trainer is started from it).
REPO = Path(__file__).resolve().parents[2]
#: What torchrun sets per rank: removed from a test's environment so an outer run cannot leak into a new one.
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def torchrun_trainer(
    spec: Mapping[str, Any],
    tmp_path: Path,
    *,
    processes: int = 2,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 240,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run ``spec`` as ``torchrun --standalone --nproc-per-node processes -m trainer``; the result and the run directory.

    The spec goes to ``tmp_path/spec.json`` and the run to ``tmp_path/run``; the environment is
    this process's without torchrun's per-rank variables, with one intra-op thread, faults
    allowed, and ``env`` on top. The caller checks the exit code (``stderr`` is captured).
    """
    spec_path, run_dir = tmp_path / "spec.json", tmp_path / "run"
    spec_path.write_text(json.dumps(spec))
    environment = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    environment |= {"OMP_NUM_THREADS": "1", "HALFCAST_ALLOW_FAULTS": "1", **(env or {})}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", str(processes),
        "-m", "trainer", "--spec", str(spec_path), "--run-dir", str(run_dir),
    ]  # fmt: skip  # each flag beside its value
    done = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=timeout_s)
    return done, run_dir


#: Collective and store timeout of the test ranks: a rank stuck in a mismatched collective fails the test instead of hanging it.
RANK_TIMEOUT_S = 60

#: ``body(ctx, *args)``: what each spawned rank runs (a module-level function, so spawn can pickle it).
RankBody = Callable[..., None]


def spawn_ranks(body: RankBody, *args: Any, world_size: int = 2) -> None:
    """Run ``body(ctx, *args)`` on ``world_size`` spawned gloo ranks of this host, ended as the trainer's ranks end.

    This process hosts the ranks' store, as torchrun's agent does (on a port the OS picks, so
    parallel test workers never race for one). After ``body`` returns, each rank frees what it
    left (FSDP's and DDP's reference cycles hold the process group), meets the others at a
    barrier and then in the store (:func:`trainer.parallel.distributed.leave_together`), leaves the group
    and exits without the interpreter's teardown (:func:`trainer.preemption.exit_now`), as a
    job's ranks do. A rank that tore gloo down while its peer was still in its last exchange,
    or whose group was freed by the garbage collector during interpreter teardown, aborted
    ("terminate called without an active exception", SIGABRT) about one run in six.
    Raises :class:`torch.multiprocessing.ProcessRaisedException` (or ``ProcessExitedException``)
    when a rank fails.
    """
    store = dist.TCPStore(
        "127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=RANK_TIMEOUT_S)
    )
    mp.start_processes(_rank_main, args=(store.port, world_size, body, args), nprocs=world_size, start_method="spawn")


def _rank_main(rank: int, port: int, world_size: int, body: RankBody, args: tuple[Any, ...]) -> None:
    ctx = init_gloo(rank, port, world_size)
    try:
        body(ctx, *args)
        gc.collect()  # models freed here, while the group is alive, not by the collector during teardown
        barrier()
        leave_together(world_size, RANK_TIMEOUT_S)
    finally:
        dist.destroy_process_group()
    exit_now(0)


def init_gloo(rank: int, port: int, world_size: int = 2) -> DistContext:
    """Join a gloo group of ``world_size`` CPU ranks whose store is hosted at ``127.0.0.1:port``, one intra-op thread each.

    ``MASTER_ADDR``/``MASTER_PORT`` name that store, as under torchrun. The collective timeout
    is :data:`RANK_TIMEOUT_S`.
    """
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    timeout = timedelta(seconds=RANK_TIMEOUT_S)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
    return DistContext(rank=rank, local_rank=rank, world_size=world_size, device=CPU)


def tiny_lm() -> GPT:
    """Field case C17's tiny causal LM (vocab 32, context 8, embedding 16), seeded."""
    torch.manual_seed(0)
    return GPT(vocab_size=32, context=8, n_layer=1, n_head=2, d_model=16)


def lm_micro_batch(valid: int, seed: int, rows: int = 2, length: int = 8) -> Batch:
    """Random tokens ``[rows, length]`` whose first ``valid`` targets (row-major) are real, the rest padding."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randint(0, 32, (rows, length), generator=generator)
    targets = torch.randint(0, 32, (rows, length), generator=generator)
    targets.view(-1)[valid:] = IGNORE_INDEX
    return token_batch(inputs, targets)


def grad_of(param: torch.Tensor) -> torch.Tensor:
    """``param``'s gradient, which the test expects a backward pass to have set."""
    assert param.grad is not None, "no gradient"
    return param.grad


def json_records(run_dir: Path) -> list[dict[str, Any]]:
    """:func:`trainer.records.read_records`, each field as JSON (``Any``: a test reads the fields it knows)."""
    return read_records(run_dir)
