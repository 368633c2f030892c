"""Halfcast's own step, through the trainer's public pieces, with its telemetry as in the real loop.

Per step: :func:`trainer.run.step.train_step` (forward and backward under the precision's
autocast and loss scale, sync-free unscale, overflow check, clip, device-side
skip, LR schedule advanced by the ``applied`` flag) and :func:`trainer.run.step.record_step`
into a :class:`trainer.run.telemetry.StepLog`. Every ``log_interval`` steps a
:class:`trainer.run.flushing.RecordFlusher` copies the rows to the host, writes the step
records to a temporary ``records.jsonl``, then the divergence guard checks the rows, exactly like
:func:`trainer.run.loop.train`, so its cost is part of the measured time.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from bench.peers.base import PeerInfo
from bench.workload import ActivationProbe, Workload, job_spec
from halfcast.contracts.spec import JobSpec
from trainer.components import build_components, build_record_flusher, divergence_guard
from trainer.data import Batch
from trainer.numerics.loss_scale import DynamicLossScaler
from trainer.optim.build import resolve_implementation
from trainer.parallel.distributed import DistContext
from trainer.records import RECORDS_FILE, RecordSink
from trainer.run.step import record_step, train_step

CPU = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def halfcast_peer(work: Workload, implementation: str = "fused") -> HalfcastRunner:
    """Halfcast's step on the MLP workload of :mod:`bench.workload`.

    ``implementation``: Halfcast's AdamW implementation (``fused`` = PyTorch's fused kernel
    given ``found_inf``; ``foreach``/``plain`` = Halfcast's masked update; ``auto``).
    """
    return HalfcastRunner(job_spec(work, implementation))


class HalfcastRunner:
    """Halfcast's trainer step on one CPU rank, built from ``spec`` exactly as a job builds it
    (``build_components``: for an ``hf`` spec, the real loader, PEFT adapter and wrapper)."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        implementation = spec.optimizer.implementation
        self.parts = build_components(self.spec, CPU)
        self._dir = Path(tempfile.mkdtemp(prefix="halfcast-bench-"))
        self._sink = RecordSink(self._dir / RECORDS_FILE)
        self.guard = divergence_guard(self.spec, self.parts)
        self.flusher = build_record_flusher(self.spec, self.parts, self._sink, CPU)  # as a real job's
        self._step = 0
        self._probe = ActivationProbe(self.parts.model)
        # parts.parameters holds Parameters typed as Tensor (trainer.optim.build asks for Parameter)
        used = resolve_implementation(implementation, self.parts.parameters)  # type: ignore[arg-type]
        scaler = self.parts.precision.scaler
        self.info = PeerInfo(
            label="Halfcast",
            requested=spec.precision,
            loss_scaling="dynamic (on device)" if isinstance(scaler, DynamicLossScaler) else "none",
            optimizer=f"trainer.optim.skipping.AdamW({used})",
            lr_on_skip="not advanced (on device)",
            version="halfcast (this checkout)",
        )

    def step(self, batch: Batch) -> None:
        """``train_step`` on the one-micro-batch window ``[batch]``, then ``record_step``."""
        self._step += 1
        result = train_step(self.parts, [batch], step=self._step, max_grad_norm=self.spec.max_grad_norm, dist_ctx=CPU)
        record_step(self.flusher.step_log, self._step, result)
        if self.info.compute_dtype == "unknown" and self._probe.dtype is not None:
            self.info.compute_dtype = self._probe.name

    def maybe_flush(self) -> bool:
        """Flush every ``log_interval`` steps, else when the oldest record waited ``log_interval_s``,
        like ``trainer.run.loop.train``; True when a flush copied anything."""
        if self.flusher.step_log.full:
            self.guard.observe(self.flusher.flush())  # write the records, then check them
            return True
        pending = self.flusher.step_log.pending
        self.flusher.flush_if_stale()
        return self.flusher.step_log.pending < pending

    def close(self) -> None:
        """Close the records file and delete its temporary directory."""
        self._sink.close()
        shutil.rmtree(self._dir, ignore_errors=True)
