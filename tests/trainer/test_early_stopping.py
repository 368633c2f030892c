"""early_stopping and keep_best: the spec's 422s, stopping at the expected evaluation on every rank, best exports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hf_support import lora_spec
from pydantic import ValidationError
from trainer_support import json_records, spawn_ranks

from halfcast.contracts.spec import JobSpec
from trainer.parallel.distributed import DistContext
from trainer.run.best import best_path
from trainer.run.checkpoint import final_path, load_checkpoint, step_path
from trainer.run.early_stopping import BestTracker
from trainer.run.loop import train

MLP = {
    "model": {"name": "mlp", "config": {"hidden_sizes": [8]}},
    "dataset": {"name": "synthetic", "config": {"in_features": 4, "num_samples": 64, "seed": 1}},
    "micro_batch_size": 8,
    "seed": 0,
}
DIGITS = {"model": {"name": "mlp", "config": {"hidden_sizes": [8]}}, "dataset": {"name": "digits"}}
#: A flat loss (a learning rate of 1e-12): only the first evaluation improves by more than min_delta.
FLAT = {
    **MLP,
    "max_steps": 10,
    "eval_interval": 1,
    "optimizer": {"lr": 1e-12},
    "early_stopping": {"metric": "loss", "patience": 2, "min_delta": 0.01},
}


@pytest.mark.parametrize(
    ("fields", "loc"),
    [
        ({**MLP, "early_stopping": {"metric": "loss"}}, ("early_stopping",)),
        ({**MLP, "keep_best": True}, ("keep_best",)),
        ({**MLP, "eval_interval": 1, "early_stopping": {"metric": "accuracy"}}, ("early_stopping", "metric")),
        ({**MLP, "eval_interval": 1, "early_stopping": {"metric": "perplexity"}}, ("early_stopping", "metric")),
        ({**DIGITS, "eval_interval": 1, "early_stopping": {"metric": "perplexity"}}, ("early_stopping", "metric")),
        ({**lora_spec(), "eval_interval": 1, "early_stopping": {"metric": "accuracy"}}, ("early_stopping", "metric")),
        ({**MLP, "eval_interval": 1, "early_stopping": {"metric": "bleu"}}, ("early_stopping", "metric")),
        ({**MLP, "eval_interval": 1, "early_stopping": {"patience": 0}}, ("early_stopping", "patience")),
        ({**MLP, "eval_interval": 1, "early_stopping": {"min_delta": -0.1}}, ("early_stopping", "min_delta")),
        ({**MLP, "eval_interval": 1, "early_stopping": {"min_delta": float("inf")}}, ("early_stopping", "min_delta")),
        ({**MLP, "eval_interval": 1, "early_stopping": {"mode": "max"}}, ("early_stopping", "mode")),
    ],
)
def test_bad_evaluation_fields_are_422_at_the_field(fields: dict[str, Any], loc: tuple[str, ...]) -> None:
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate(fields)
    assert caught.value.errors()[0]["loc"][: len(loc)] == loc


def test_each_task_accepts_its_own_metrics() -> None:
    for fields, metric, mode in [(DIGITS, "accuracy", "max"), (lora_spec(), "perplexity", "min"), (MLP, "loss", "min")]:
        spec = JobSpec.model_validate(
            {**fields, "eval_interval": 1, "keep_best": True, "early_stopping": {"metric": metric}}
        )
        assert spec.early_stopping is not None and spec.early_stopping.mode == mode and spec.best_metric == metric


def test_the_tracker_counts_evaluations_without_an_improvement_above_min_delta() -> None:
    tracker = BestTracker("accuracy", "max", patience=2, min_delta=0.05)
    decisions = [tracker.update(step, value) for step, value in [(1, 0.5), (2, 0.6), (3, 0.64), (4, None), (5, 0.9)]]
    assert [(d.improved, d.stop) for d in decisions] == [
        (True, False),
        (True, False),
        (False, False),
        (False, True),
        (True, False),
    ]
    assert (tracker.best_step, tracker.best_value) == (5, 0.9)


def test_early_stopping_ends_the_job_at_the_expected_evaluation(cpu_ctx: DistContext, tmp_path: Path) -> None:
    result = train(JobSpec.model_validate(FLAT), tmp_path, cpu_ctx)
    records = json_records(tmp_path)
    evals = [r for r in records if r["type"] == "eval"]
    assert [e["step"] for e in evals] == [1, 2, 3]  # the first improves; 2 and 3 do not: patience 2
    assert result.steps == 3 and max(r["step"] for r in records if r["type"] == "step") == 3
    end = records[-1]
    assert end["type"] == "end" and end["steps"] == 3 and end["applied_steps"] == 3
    assert end["stopped_early"] == {"step": 3, "metric": "loss", "best_step": 1, "best_value": evals[0]["loss"]}
    assert load_checkpoint(final_path(tmp_path))["step"] == 3


def test_a_job_that_keeps_improving_runs_to_max_steps(cpu_ctx: DistContext, tmp_path: Path) -> None:
    spec = JobSpec.model_validate(
        {**FLAT, "max_steps": 4, "optimizer": {"lr": 0.05}, "early_stopping": {"patience": 3}}
    )
    train(spec, tmp_path, cpu_ctx)
    end = json_records(tmp_path)[-1]
    assert end["steps"] == 4 and "stopped_early" not in end


def _stop_rank(ctx: DistContext, out: str) -> None:
    rank = ctx.rank
    result = train(JobSpec.model_validate({**FLAT, "processes": 2}), Path(out) / "run", ctx)
    torch.save({"steps": result.steps}, Path(out) / f"rank{rank}.pt")


@pytest.mark.slow
def test_two_ranks_stop_early_at_the_same_step(tmp_path: Path) -> None:
    spawn_ranks(_stop_rank, str(tmp_path))
    assert [torch.load(tmp_path / f"rank{r}.pt")["steps"] for r in range(2)] == [3, 3]
    assert json_records(tmp_path / "run")[-1]["stopped_early"]["step"] == 3


# ----------------------------------------------------------------------------- keep_best

#: An LoRA job whose learning rate warms up towards 100: the evaluation at step 6 is worse than step 5's.
WORSENING = {
    "max_steps": 6,
    "eval_interval": 1,
    "keep_best": True,
    "optimizer": {"lr": 100.0},
    "lr_scheduler": {"warmup_steps": 400},
}


def _exported_adapter(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "export" / "adapter" / "adapter_model.safetensors"))


def _as_export_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint keys (``model.<peft path>.lora_A.default.weight``) as PEFT's export names them."""
    return {k.removeprefix("model.").replace(".default", ""): v for k, v in state.items()}


def test_keep_best_exports_the_best_evaluated_weights(model_roots: Path, cpu_ctx: DistContext, tmp_path: Path) -> None:
    spec = JobSpec.model_validate(lora_spec(**WORSENING))
    train(spec, tmp_path, cpu_ctx)
    records = json_records(tmp_path)
    losses = {r["step"]: r["loss"] for r in records if r["type"] == "eval"}
    best_step = min(losses, key=losses.__getitem__)
    assert best_step < 6  # the scenario made a later evaluation worse
    assert records[-1]["exported_step"] == best_step
    best = load_checkpoint(best_path(tmp_path))
    assert best["step"] == best_step
    exported, kept = _exported_adapter(tmp_path), _as_export_keys(best["model"])
    assert exported.keys() == kept.keys() and all(torch.equal(exported[k], kept[k]) for k in kept)
    last = _as_export_keys(load_checkpoint(final_path(tmp_path))["model"])
    assert not all(torch.equal(exported[k], last[k]) for k in kept)  # not the last state


def test_keep_best_survives_a_resume(model_roots: Path, cpu_ctx: DistContext, tmp_path: Path) -> None:
    first, resumed = tmp_path / "first", tmp_path / "resumed"
    spec = JobSpec.model_validate(lora_spec(**WORSENING, checkpoint_interval=5))
    train(spec, first, cpu_ctx)
    train(spec, resumed, cpu_ctx, resume_from=step_path(first, 5))
    end = json_records(resumed)[-1]
    assert end["exported_step"] == json_records(first)[-1]["exported_step"] == 5
    assert load_checkpoint(best_path(resumed))["step"] == 5
    exported, original = _exported_adapter(resumed), _exported_adapter(first)
    assert all(torch.equal(exported[k], original[k]) for k in original)
