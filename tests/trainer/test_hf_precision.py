"""hf LoRA models keep the trainer's guarantees: fp16 overflow skips, bf16 base weights, no host syncs,
token-normalised accumulation, forensics names; and sequence classification with an attention mask."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hf_support import lora_spec
from test_syncs import _count_loop
from trainer_support import grad_of, json_records, lm_micro_batch

from halfcast.contracts.catalog import HFConfig
from halfcast.contracts.spec import AdapterSpec, JobSpec
from trainer.components import build_components
from trainer.data.base import Batch, DataInfo, Task
from trainer.hf.adapters import apply_lora
from trainer.hf.export import merged_copy
from trainer.hf.loading import load_base_model, load_tokenizer
from trainer.hf.wrapper import HFModule
from trainer.losses import task_loss
from trainer.parallel.distributed import DistContext
from trainer.run import loop
from trainer.run.step import accumulate_window
from trainer.sync_counter import HostSyncCounter


def _spec(**overrides: Any) -> JobSpec:
    return JobSpec.model_validate(lora_spec(**overrides))


def test_fp16_overflow_skips_keeps_adapter_weights_and_names_them(
    model_roots: Path, tmp_path: Path, cpu_ctx: DistContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec(
        precision="fp16",
        loss_scale={"init_scale": 1024},
        max_steps=3,
        log_interval=1,
        faults={"nonfinite_grad_steps": [2]},
    )
    snapshots: list[dict[str, torch.Tensor]] = []
    built: list[Any] = []
    build, record = loop.build_components, loop.record_step

    def capture(*args: Any, **kwargs: Any) -> Any:
        built.append(build(*args, **kwargs))
        return built[-1]

    def snapshot(step_log: Any, step: int, outcome: Any) -> None:
        record(step_log, step, outcome)
        snapshots.append({n: p.detach().clone() for n, p in built[-1].model.named_parameters() if p.requires_grad})

    monkeypatch.setattr(loop, "build_components", capture)
    monkeypatch.setattr(loop, "record_step", snapshot)
    result = loop.train(spec, tmp_path, cpu_ctx)
    steps = [r for r in json_records(tmp_path) if r["type"] == "step"]
    assert [s["overflow"] for s in steps] == [False, True, False] and result.skipped_steps == 1
    assert [s["loss_scale"] for s in steps] == [1024.0, 1024.0, 512.0]
    assert all(torch.equal(snapshots[0][n], snapshots[1][n]) for n in snapshots[0])  # skipped: untouched
    assert not all(torch.equal(snapshots[1][n], snapshots[2][n]) for n in snapshots[1])
    names = [p["name"] for p in steps[1]["nonfinite_params"]]
    assert names[0] == "model.layers.0.self_attn.q_proj.lora_A.default.weight"
    assert steps[1]["nonfinite_param_count"] == 1
    frozen = {p.dtype for p in result.model.parameters() if not p.requires_grad}
    assert frozen == {torch.float16}


def test_bf16_trains_with_bf16_base_and_fp32_adapters(model_roots: Path, tmp_path: Path, cpu_ctx: DistContext) -> None:
    spec = _spec(precision="bf16", max_steps=3)
    loop.train(spec, tmp_path, cpu_ctx)
    records = json_records(tmp_path)
    start = next(r for r in records if r["type"] == "start")
    assert set(start["model"]["parameter_bytes_by_dtype"]) == {"bfloat16", "float32"}
    assert start["compute_dtype"] == "bfloat16" and records[-1]["type"] == "end"
    assert all(r["loss"] == r["loss"] for r in records if r["type"] == "step")


def test_no_host_sync_in_any_step_of_an_hf_lora_job(
    model_roots: Path, tmp_path: Path, cpu_ctx: DistContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec(
        precision="fp16",
        loss_scale={"init_scale": 1024},
        max_steps=4,
        gradient_accumulation_steps=2,
        max_grad_norm=1.0,
        optimizer={"lr": 0.01, "implementation": "foreach"},
    )
    with _count_loop(monkeypatch) as counts:
        loop.train(spec, tmp_path, cpu_ctx)
    assert counts["steps"] == [0] * 4
    assert counts["copies_per_flush"] == [1, 1, 1] and counts["scalar_reads_per_flush"] == [0, 0, 0]  # after 1, 2, 4


def test_a_masked_forward_and_backward_makes_no_host_sync(model_roots: Path, cpu_ctx: DistContext) -> None:
    parts = build_components(_spec(precision="bf16"), cpu_ctx)
    batch = lm_micro_batch(valid=12, seed=1)
    mask = torch.ones_like(batch.inputs)
    mask[1, 5:] = 0
    masked = Batch(batch.inputs, batch.targets, batch.num_samples, batch.num_elements, batch.num_tokens, mask)
    with HostSyncCounter() as reads:
        with parts.precision.autocast():
            loss = parts.loss_fn(parts.model, masked)
        loss.backward()
    assert reads.total == 0


def test_padding_is_masked_out_of_attention(model_roots: Path, cpu_ctx: DistContext) -> None:
    """The real tokens' logits of a right-padded row equal those of the unpadded row."""
    model = build_components(_spec(), cpu_ctx).model.eval()
    row = torch.tensor([[5, 17, 200, 33, 9]])
    padded = torch.cat([row, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])
    with torch.no_grad():
        torch.testing.assert_close(model(padded, mask)[:, :5], model(row), rtol=0, atol=1e-6)
        assert not torch.allclose(
            model(torch.cat([row, torch.full((1, 3), 7)], 1), None)[:, 5:], model(padded, mask)[:, 5:]
        )


def test_accumulation_normalises_by_the_window_token_count(model_roots: Path, cpu_ctx: DistContext) -> None:
    """Two micro-batches with 3 and 13 valid targets give the gradient of the mean over all 16 tokens."""
    parts = build_components(_spec(), cpu_ctx)
    first, second = lm_micro_batch(valid=3, seed=1), lm_micro_batch(valid=13, seed=2)
    accumulate_window(parts.model, [first, second], parts.precision, parts.loss_fn, cpu_ctx)
    accumulated = [grad_of(p).clone() for p in parts.parameters]
    for p in parts.parameters:
        p.grad = None
    whole = Batch(torch.cat([first.inputs, second.inputs]), torch.cat([first.targets, second.targets]), 4, 16, 32)
    (parts.loss_fn(parts.model, whole) / 16).backward()
    for got, want in zip(accumulated, (p.grad for p in parts.parameters), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_sequence_classification_lora_trains_the_head_and_exports(model_roots: Path, tmp_path: Path) -> None:
    """A token-classification batch source of the contract's shape ([B, T] ids + mask, [B] labels)."""
    from transformers import AutoModelForSequenceClassification

    config = HFConfig(path="llama", task="sequence_classification", num_labels=3)
    info = DataInfo(task=Task.CLASSIFICATION, num_outputs=3, seq_len=8)
    tokenizer = load_tokenizer(config, "jsonl")  # its pad token (id 0) is what the head pools up to
    torch.manual_seed(0)
    assert tokenizer is not None
    base: Any = load_base_model(config, info, tokenizer)  # a transformers model: its config is not typed
    assert base.config.pad_token_id == tokenizer.pad_token_id == 0
    peft = apply_lora(base, AdapterSpec(r=4, target_modules=["q_proj"]), config)
    model = HFModule(peft, causal=True, adapter=True)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any(".score." in n for n in trainable) and all(".lora_" in n or ".score." in n for n in trainable)
    inputs = torch.tensor([[5, 17, 200, 33, 9, 0, 0, 0], [1, 2, 3, 4, 250, 251, 252, 253]])
    mask = (inputs != 0).long()
    batch = Batch(inputs, torch.tensor([2, 0]), 2, 2, 16, mask)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    for _ in range(3):
        loss = task_loss(Task.CLASSIFICATION)(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    logits = model.eval()(inputs, mask)
    assert logits.shape == (2, 3)
    merged: Any = merged_copy(model)  # a transformers model: save_pretrained is not typed
    merged.save_pretrained(str(tmp_path / "m"), safe_serialization=True)
    reloaded = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "m")).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=inputs, attention_mask=mask).logits, logits, rtol=0, atol=1e-5)


def _trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}


def test_an_hf_lora_job_falls_back_to_bf16_like_a_bf16_job(
    model_roots: Path, tmp_path: Path, cpu_ctx: DistContext
) -> None:
    """``fallback_bf16`` on an hf LoRA job: fp16 overflows on steps 2-4 trip the guard (no healthy
    checkpoint: rewind to step 0); the job goes on in bf16 with its frozen base rebuilt in bf16, and
    ends with the adapter weights of a plain bf16 job, bit for bit."""
    common = {"max_steps": 5, "log_interval": 1, "optimizer": {"lr": 0.01}}
    spec = _spec(
        precision="fp16",
        loss_scale={"init_scale": 2.0},
        on_divergence="fallback_bf16",
        max_consecutive_skips=3,
        faults={"nonfinite_grad_steps": [2, 3, 4], "nonfinite_grad_precisions": ["fp16"]},
        **common,
    )
    result = loop.train(spec, tmp_path / "fallback", cpu_ctx)
    reference = loop.train(_spec(precision="bf16", **common), tmp_path / "bf16", cpu_ctx)

    records = json_records(tmp_path / "fallback")
    [switch] = [r for r in records if r["type"] == "precision_switch"]
    assert (switch["from"], switch["to"], switch["rewound_to_step"]) == ("fp16", "bf16", 0)
    assert {p.dtype for p in result.model.parameters() if not p.requires_grad} == {torch.bfloat16}
    got, want = _trainable(result.model), _trainable(reference.model)
    assert got.keys() == want.keys() and all(torch.equal(got[name], want[name]) for name in got)


def test_an_hf_lora_job_reports_the_underflow_fraction_of_its_adapter_gradients(
    model_roots: Path, tmp_path: Path, cpu_ctx: DistContext
) -> None:
    """Underflow telemetry samples the scaled gradients of the trainable (adapter) parameters; a higher
    loss scale leaves fewer of them below fp16's smallest normal."""
    fractions = []
    for scale in (1.0, 65536.0):
        spec = _spec(
            precision="fp16",
            loss_scale={"init_scale": scale, "underflow_sample_interval": 1},
            max_steps=2,
            log_interval=1,
        )
        loop.train(spec, tmp_path / str(scale), cpu_ctx)
        steps = [r for r in json_records(tmp_path / str(scale)) if r["type"] == "step"]
        assert all(0.0 <= s["underflow_fraction"] <= 1.0 for s in steps)
        fractions.append(steps[0]["underflow_fraction"])
    assert fractions[1] < fractions[0]
