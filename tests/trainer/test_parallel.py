"""DDP across two gloo ranks: global token normalisation (C17) and gradient sync on the last micro-batch only."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from trainer_support import grad_of, spawn_ranks

from halfcast.contracts.spec import JobSpec
from trainer.data import IGNORE_INDEX, Batch, Task
from trainer.data.base import token_batch
from trainer.losses import task_loss
from trainer.models.gpt import GPT
from trainer.numerics.precision import build_precision
from trainer.parallel.distributed import DistContext
from trainer.parallel.wrap import unwrap_model, wrap_model
from trainer.run.step import accumulate_window

WORLD_SIZE = 2
#: (valid tokens, seed) of each micro-batch, per rank: K=2 windows of unequal token counts.
RANK_MICRO_BATCHES = {0: [(10, 1), (2, 2)], 1: [(3, 3), (7, 4)]}
FP32_SPEC = {"model": {"name": "gpt"}, "dataset": {"name": "text"}, "precision": "fp32"}


def _tiny_lm() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=32, context=8, n_layer=1, n_head=2, d_model=16)


def _micro_batch(valid: int, seed: int) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randint(0, 32, (2, 8), generator=generator)
    targets = torch.randint(0, 32, (2, 8), generator=generator)
    targets.view(-1)[valid:] = IGNORE_INDEX
    return token_batch(inputs, targets)


def _rank_worker(ctx: DistContext, out_dir: str) -> None:
    rank = ctx.rank
    model = wrap_model(_tiny_lm(), ctx)
    synced: list[torch.Tensor] = []

    def counting_hook(state, bucket):  # DDP rejects string annotations
        synced.append(bucket.buffer().clone())
        return default_hooks.allreduce_hook(None, bucket)

    assert isinstance(model, DistributedDataParallel)
    model.register_comm_hook(None, counting_hook)
    precision = build_precision(JobSpec.model_validate(FP32_SPEC), ctx.device)
    batches = [_micro_batch(valid, seed) for valid, seed in RANK_MICRO_BATCHES[rank]]
    stats = accumulate_window(model, batches, precision, task_loss(Task.LM), ctx)
    grads = [grad_of(p).clone() for p in unwrap_model(model).parameters()]
    torch.save(
        {"grads": grads, "synced": synced, "loss": stats.loss, "elements": stats.num_elements},
        Path(out_dir) / f"rank{rank}.pt",
    )
    # The Python comm hook's all-reduce work holds Python tensors; gloo destroys each work on its
    # own thread, which needs the GIL. Wait until that is done (a barrier runs after it), and drop
    # DDP's reducer while the process group is alive: freeing it later, with the GIL held, while
    # that thread still wanted the GIL deadlocked the rank (torch 2.13).
    dist.barrier()
    del model


def test_two_ranks_normalise_by_the_global_token_count_and_sync_once(tmp_path: Path) -> None:
    """C17 across ranks, and DDP gradient sync only on the last micro-batch of the window.

    Rank 0 holds micro-batches with 10 and 2 valid tokens, rank 1 with 3 and 7. After
    one K=2 window both ranks hold the full-batch gradient normalised by the global 22
    tokens (within 1e-6) and log the full-batch mean loss. The comm hook ran once per
    rank, on a bucket already holding both micro-batches' local gradients.
    """
    spawn_ranks(_rank_worker, str(tmp_path), world_size=WORLD_SIZE)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD_SIZE)]

    model = _tiny_lm()
    every = [_micro_batch(v, s) for r in range(WORLD_SIZE) for v, s in RANK_MICRO_BATCHES[r]]
    full = token_batch(torch.cat([b.inputs for b in every]), torch.cat([b.targets for b in every]))
    assert full.num_elements == 22
    ref_loss = task_loss(Task.LM)(model, full) / 22
    reference = torch.autograd.grad(ref_loss, list(model.parameters()))

    for result in results:
        assert result["elements"] == 22
        assert abs(result["loss"] - ref_loss.item()) < 1e-6
        for got, ref in zip(result["grads"], reference, strict=True):
            torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)
        assert len(result["synced"]) == 1  # one bucket, synced once per window
    # The synced buckets held each rank's whole window (both micro-batches): their mean is the full gradient.
    flat_reference = torch.cat([g.reshape(-1) for g in reference])
    mean_bucket = (results[0]["synced"][0] + results[1]["synced"][0]) / WORLD_SIZE
    assert mean_bucket.numel() == flat_reference.numel()
    torch.testing.assert_close(mean_bucket.sort().values, flat_reference.sort().values, atol=1e-6, rtol=0)
