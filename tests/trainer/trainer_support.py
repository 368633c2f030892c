"""Helpers shared by the trainer tests: gloo process groups on localhost and a tiny causal LM with padding."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer.data import IGNORE_INDEX, Batch
from trainer.data.base import token_batch
from trainer.distributed import DistContext
from trainer.models.gpt import GPT

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


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a gloo rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def init_gloo(rank: int, port: int, world_size: int = 2) -> DistContext:
    """Join a gloo group of ``world_size`` CPU ranks at ``127.0.0.1:port``, one intra-op thread each.

    The collective timeout is 60 s: a rank stuck in a mismatched collective fails the
    test instead of hanging it.
    """
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
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
