"""``transformers.Trainer`` on the LoRA workload, driven one optimizer step at a time.

``Trainer.train()`` owns its loop, so it runs in a worker thread whose :class:`StepGate`
callback blocks after every ``on_step_end`` until the benchmark asks for the next step: the
interleaved rounds of :mod:`bench.measure` then time it like every other path (the handoff
between threads, two semaphore operations, is inside its measured time). A step as the
gate sees it runs from the wake-up after the previous ``on_step_end`` to this step's
``on_step_end``: batch fetch, ``training_step``, the loss NaN filter, clipping, optimizer,
schedule and the log/save checks of the previous step are all in it, once. Host syncs are
counted in the worker thread over that same span (:meth:`TrainerRunner.counted_step`).

The Trainer gets the peers' model (``from_pretrained`` + ``get_peft_model``), their fused
AdamW and ``LambdaLR``, the same micro-batches in order (an iterable dataset, no shuffling)
and the same mean next-token loss (``compute_loss_func``; the labels are already shifted).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset

from bench.lora_workload import MODEL_NAME, LoraWorkload, make_batches, mean_token_loss, peer_model
from bench.peers.base import PeerInfo
from bench.workload import ActivationProbe, peer_optimizer, peer_scheduler
from trainer.data import Batch
from trainer.sync_counter import HostSyncCounter

#: Seconds the benchmark waits for one Trainer step before declaring the worker stuck.
STEP_TIMEOUT_S = 300.0


class BatchRows(IterableDataset):
    """The rows of ``batches``, in order, endlessly: ``{"input_ids", "labels"}`` per sample."""

    def __init__(self, batches: Sequence[Batch]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            for batch in self.batches:
                for inputs, targets in zip(batch.inputs, batch.targets, strict=True):
                    yield {"input_ids": inputs, "labels": targets}


def shifted_loss(outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
    """``compute_loss_func``: the mean next-token loss against already-shifted labels (the hand loop's)."""
    return mean_token_loss(outputs.logits, labels)


class StepGate:
    """A ``TrainerCallback`` that lets the Trainer take one step per :meth:`release`.

    Built lazily as a subclass of ``TrainerCallback`` by :func:`gate_callback`. ``step_seconds``:
    the in-thread time of every step; ``last_syncs``: host syncs of the last counted step.
    """

    def __init__(self) -> None:
        self.go = threading.Semaphore(0)
        self.done = threading.Semaphore(0)
        self.stop = False
        self.count_next = False
        self.last_syncs = 0
        self.step_seconds: list[float] = []
        self._start = 0.0
        self._counter: HostSyncCounter | None = None

    def _wait_for_permit(self) -> None:
        self.go.acquire()
        if self.count_next:
            self._counter = HostSyncCounter().__enter__()
        self._start = time.perf_counter()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Wait for the first step's permit."""
        self._wait_for_permit()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Record the step, report it done, and wait for the next permit (or stop)."""
        self.step_seconds.append(time.perf_counter() - self._start)
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.last_syncs, self._counter = self._counter.total, None
        self.done.release()
        self._wait_for_permit()
        if self.stop:
            control.should_training_stop = True


def gate_callback() -> StepGate:
    """A :class:`StepGate` that is also a ``transformers.TrainerCallback``."""
    from transformers import TrainerCallback

    class _Gate(StepGate, TrainerCallback):
        pass

    return _Gate()


class TrainerRunner:
    """HF Trainer in a worker thread; :meth:`step` runs exactly one of its optimizer steps."""

    def __init__(self, work: LoraWorkload, root: Path) -> None:
        import peft
        import transformers

        self.work = work
        self._dir = Path(tempfile.mkdtemp(prefix="halfcast-bench-trainer-"))
        model = peer_model(work, root / MODEL_NAME)
        self._probe = ActivationProbe(model)
        optimizer = peer_optimizer(model, work)
        self.gate = gate_callback()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.trainer = transformers.Trainer(
                model=model,
                args=self._arguments(),
                train_dataset=BatchRows(make_batches(work)),
                optimizers=(optimizer, peer_scheduler(optimizer, work)),
                compute_loss_func=shifted_loss,
                callbacks=[self.gate],  # type: ignore[list-item]  # a TrainerCallback subclass (gate_callback)
            )
        self.info = PeerInfo(
            label="HF Trainer",
            requested=work.precision,
            loss_scaling=self._loss_scaling(),
            optimizer="torch.optim.AdamW(fused=True)",
            lr_on_skip="n/a",
            version=f"transformers {transformers.__version__}, peft {peft.__version__}, "
            f"accelerate mixed_precision={self.trainer.accelerator.mixed_precision!r}",
            notes=[str(w.message).splitlines()[0] for w in caught],
        )
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._train, name="hf-trainer", daemon=True)
        self._thread.start()

    def _arguments(self) -> Any:
        from transformers import TrainingArguments

        work = self.work
        return TrainingArguments(
            output_dir=str(self._dir),
            bf16=work.precision == "bf16",
            fp16=work.precision == "fp16",
            use_cpu=True,
            max_steps=work.total_steps,
            per_device_train_batch_size=work.micro_batch_size,
            gradient_accumulation_steps=1,
            max_grad_norm=work.max_grad_norm,
            logging_steps=10**9,
            save_strategy="no",
            report_to=[],
            dataloader_num_workers=0,
            disable_tqdm=True,
            seed=work.seed,
            remove_unused_columns=False,
            torch_compile=work.compile,
        )

    def _loss_scaling(self) -> str:
        scaler = getattr(self.trainer.accelerator, "scaler", None)
        return "dynamic (GradScaler)" if scaler is not None else "none"

    def _train(self) -> None:
        try:
            self.trainer.train()
        except BaseException as exc:  # noqa: BLE001 - re-raised by step(), in the caller's thread
            self._error = exc
            self.gate.done.release()

    def step(self, batch: Batch) -> None:
        """One Trainer optimizer step (``batch`` is ignored: the Trainer reads the same batches itself)."""
        self.gate.go.release()
        if not self.gate.done.acquire(timeout=STEP_TIMEOUT_S) or self._error is not None:
            raise RuntimeError(f"the HF Trainer did not finish a step: {self._error!r}")
        if self.info.compute_dtype == "unknown" and self._probe.dtype is not None:
            self.info.compute_dtype = self._probe.name

    def counted_step(self, batch: Batch) -> int:
        """One step with its host syncs counted in the Trainer's thread; returns the count."""
        self.gate.count_next = True
        try:
            self.step(batch)
        finally:
            self.gate.count_next = False
        return self.gate.last_syncs

    def maybe_flush(self) -> bool:
        """Nothing to flush: logging is off (``logging_steps`` beyond the run)."""
        return False

    def close(self) -> None:
        """Stop the Trainer after its current step, join the thread, delete its output directory."""
        self.gate.stop = True
        self.gate.go.release()
        self._thread.join(timeout=STEP_TIMEOUT_S)
        shutil.rmtree(self._dir, ignore_errors=True)
