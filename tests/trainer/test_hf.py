"""hf models end to end on the CPU: safe loading, LoRA training, adapter checkpoints and exact resume, exports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_support import TINY_LLAMA, lora_spec
from trainer_support import json_records

from halfcast.contracts.catalog import HFConfig
from halfcast.contracts.spec import JobSpec
from trainer.components import build_components
from trainer.errors import TrainerError
from trainer.export import load_trained_model
from trainer.hf.export import write_exports
from trainer.hf.wrapper import HFModule
from trainer.parallel.distributed import DistContext
from trainer.run.checkpoint import final_path, step_path
from trainer.run.loop import TrainResult, train

TOKENS = torch.tensor([[5, 17, 200, 33, 9, 101, 7, 64], [1, 2, 3, 4, 250, 251, 252, 253]])


def _train(tmp: Path, ctx: DistContext, **overrides: Any) -> tuple[JobSpec, TrainResult, list[dict[str, Any]]]:
    spec = JobSpec.model_validate(lora_spec(**overrides))
    result = train(spec, tmp, ctx)
    return spec, result, json_records(tmp)


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=TOKENS).logits


@pytest.fixture(scope="module")
def lora_run(hf_model_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One fp32 LoRA job on the pretrained tiny Llama (4 steps, checkpoint at 2), shared by the export tests."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HALFCAST_MODEL_ROOTS", str(hf_model_root))
    run_dir = tmp_path_factory.mktemp("lora-run")
    ctx = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    try:
        spec, result, records = _train(run_dir, ctx, checkpoint_interval=2)
    finally:
        mp.undo()
    return {"spec": spec, "result": result, "records": records, "run_dir": run_dir}


# ----------------------------------------------------------------------------- loading


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("remote-code", "remote code"),
        ("pickle-only", "only pickle weights"),
        ("missing", "not a directory under any"),
    ],
)
def test_unsafe_or_missing_model_directories_are_model_unavailable(
    path: str, message: str, model_roots: Path, cpu_ctx: DistContext
) -> None:
    spec = JobSpec.model_validate(lora_spec(model={"name": "hf", "config": {"path": path}}))
    with pytest.raises(TrainerError, match=message) as info:
        build_components(spec, cpu_ctx)
    assert info.value.reason == "model_unavailable"


def test_weights_that_cannot_be_read_are_model_unavailable_not_a_rank_crash(
    model_roots: Path, tmp_path: Path, cpu_ctx: DistContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24 item 8: a ``model.safetensors`` that is a renamed pickle raised ``SafetensorError`` (``rank_failed``)."""
    import pickle
    import shutil

    root = tmp_path / "root"
    shutil.copytree(model_roots / "llama", root / "llama")
    for weights in (root / "llama").glob("*.safetensors"):
        weights.write_bytes(pickle.dumps({"w": list(range(100))}))
    monkeypatch.setenv("HALFCAST_MODEL_ROOTS", str(root))
    spec = JobSpec.model_validate(lora_spec(model={"name": "hf", "config": {"path": "llama"}}))
    with pytest.raises(TrainerError, match="cannot build the model") as info:
        build_components(spec, cpu_ctx)
    assert info.value.reason == "model_unavailable"


def test_a_symlink_out_of_the_model_root_is_refused(
    model_roots: Path, tmp_path: Path, cpu_ctx: DistContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "escape").symlink_to(model_roots / "llama")
    monkeypatch.setenv("HALFCAST_MODEL_ROOTS", str(root))
    spec = JobSpec.model_validate(lora_spec(model={"name": "hf", "config": {"path": "escape"}}))
    with pytest.raises(TrainerError, match="leaves its model root") as info:
        build_components(spec, cpu_ctx)
    assert info.value.reason == "model_unavailable"


def test_a_target_module_that_matches_nothing_fails_naming_it(model_roots: Path, cpu_ctx: DistContext) -> None:
    spec = JobSpec.model_validate(lora_spec(adapter={"target_modules": ["q_proj", "qkv_proj"]}))
    with pytest.raises(TrainerError, match=r"\['qkv_proj'\]") as info:
        build_components(spec, cpu_ctx)
    assert info.value.reason == "spec_invalid"


def test_hf_config_without_a_tokenizer_is_byte_level(cpu_ctx: DistContext) -> None:
    config = {key: value for key, value in TINY_LLAMA.items() if key != "vocab_size"}
    spec = JobSpec.model_validate(lora_spec(model={"name": "hf", "config": {"hf_config": config}}, adapter=None))
    parts = build_components(spec, cpu_ctx)
    assert isinstance(parts.model, HFModule)
    base: Any = parts.model.base_model()  # a transformers model: its config is not typed
    assert parts.tokenizer is None and base.config.vocab_size == 256
    small = JobSpec.model_validate(
        lora_spec(model={"name": "hf", "config": {"hf_config": {**config, "vocab_size": 100}}})
    )
    with pytest.raises(TrainerError, match="vocab_size"):
        build_components(small, cpu_ctx)


def test_only_adapters_train_and_only_they_get_optimizer_state(model_roots: Path, cpu_ctx: DistContext) -> None:
    parts = build_components(JobSpec.model_validate(lora_spec(precision="bf16")), cpu_ctx)
    trainable = {n for n, p in parts.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    assert {p.dtype for p in parts.parameters} == {torch.float32}
    frozen = {p.dtype for p in parts.model.parameters() if not p.requires_grad}
    assert frozen == {torch.bfloat16}  # base_dtype compute
    optimized = {id(p) for group in parts.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in parts.parameters} and len(parts.optimizer.state) == len(trainable)


# ----------------------------------------------------------------------------- training, checkpoints, exports


def test_start_record_describes_the_model(lora_run: dict[str, Any]) -> None:
    start = next(r for r in lora_run["records"] if r["type"] == "start")
    assert start["model"]["class"] == "LlamaForCausalLM"
    assert 0 < start["model"]["trainable_parameters"] < start["model"]["parameters"]
    assert set(start["model"]["parameter_bytes_by_dtype"]) == {"float32"}
    losses = [r["loss"] for r in lora_run["records"] if r["type"] == "step"]
    assert losses[-1] < losses[0]


def test_adapter_checkpoints_hold_only_the_trainable_state(lora_run: dict[str, Any]) -> None:
    payload = torch.load(final_path(lora_run["run_dir"]), weights_only=True)
    model = lora_run["result"].model
    assert set(payload["model"]) == {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(torch.equal(payload["model"][n], p) for n, p in model.named_parameters() if p.requires_grad)


def test_the_adapter_export_reloads_on_the_base_with_identical_logits(
    lora_run: dict[str, Any], hf_model_root: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter = lora_run["run_dir"] / "export" / "adapter"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter.iterdir()}
    base = AutoModelForCausalLM.from_pretrained(str(hf_model_root / "llama"), dtype=torch.float32)
    reloaded = PeftModel.from_pretrained(base, str(adapter)).eval()
    trained = lora_run["result"].model.eval()
    assert torch.equal(_logits(reloaded), _logits(trained.model))


def test_the_merged_export_loads_with_plain_transformers(lora_run: dict[str, Any], hf_model_root: Path) -> None:
    from transformers import AutoModelForCausalLM

    exported = lora_run["run_dir"] / "export" / "model"
    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "model.safetensors"} <= names and "tokenizer.json" not in names  # byte-level data
    assert not any(p.name.endswith(".tmp") for p in exported.parent.iterdir())
    merged = AutoModelForCausalLM.from_pretrained(str(exported), local_files_only=True, use_safetensors=True)
    trained = lora_run["result"].model.eval()
    torch.testing.assert_close(_logits(merged), _logits(trained.model), rtol=0, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(str(hf_model_root / "llama"))
    assert (_logits(merged) - _logits(base)).abs().max() > 1e-4  # the adapter was merged in


def test_no_export_names_a_worker_path_and_the_adapter_loads_elsewhere(
    lora_run: dict[str, Any], hf_model_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25 item 4: adapter_config.json named the base by the worker's absolute path; now by its path
    relative to a model root, with the base's fingerprint in halfcast_export.json."""
    from peft import AutoPeftModelForCausalLM

    from trainer.inputs import directory_fingerprint

    export = lora_run["run_dir"] / "export"
    local = {str(hf_model_root).encode(), str(hf_model_root.resolve()).encode()}
    for file in (f for f in export.rglob("*") if f.is_file()):
        assert not any(path in file.read_bytes() for path in local), file
    config = json.loads((export / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "llama"
    for kind in ("adapter", "model"):
        metadata = json.loads((export / kind / "halfcast_export.json").read_text())
        assert metadata["base"] == {"path": "llama", "fingerprint": directory_fingerprint(hf_model_root / "llama")}
    elsewhere = tmp_path / "another-machine"  # the base copied under another root: loaded by its portable name
    shutil.copytree(hf_model_root / "llama", elsewhere / "llama")
    monkeypatch.chdir(elsewhere)
    loaded = AutoPeftModelForCausalLM.from_pretrained(str(export / "adapter"), local_files_only=True).eval()
    assert torch.equal(_logits(loaded), _logits(lora_run["result"].model.eval().model))


def test_the_merged_export_was_checked_against_the_trained_model(lora_run: dict[str, Any]) -> None:
    """Issue 25 item 2: the check's result is in the end record and the model export's metadata."""
    end = lora_run["records"][-1]
    check = end["export_check"]
    assert check["rows"] >= 1 and check["dtype"] == "float32"
    assert 0 <= check["max_logit_difference"] <= 1e-5 < check["tolerance"]
    metadata = json.loads((lora_run["run_dir"] / "export" / "model" / "halfcast_export.json").read_text())
    assert metadata["check"] == check


def test_a_wrong_merged_export_fails_and_nothing_is_published(
    lora_run: dict[str, Any], model_roots: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merge that loses the trained delta (here: the adapter unloaded instead of merged) is export_failed."""
    import trainer.hf.export as export_module
    from trainer.data.base import token_batch

    model = load_trained_model(final_path(lora_run["run_dir"]))
    assert isinstance(model, HFModule)
    monkeypatch.setattr(export_module, "_merged", lambda m, adapter: m.unload().eval() if adapter else m.eval())
    rows = token_batch(TOKENS, TOKENS)
    for parameter in (p for n, p in model.named_parameters() if "lora_B" in n):
        parameter.data.fill_(0.5)  # a delta no rounding could hide
    with pytest.raises(TrainerError) as failure:
        write_exports(model, None, tmp_path, check_rows=rows)
    assert failure.value.reason == "export_failed" and "not published" in failure.value.message
    assert not (tmp_path / "export").exists() or not any((tmp_path / "export").iterdir())


def test_load_trained_model_rebuilds_an_adapter_checkpoint(lora_run: dict[str, Any], model_roots: Path) -> None:
    rebuilt = load_trained_model(final_path(lora_run["run_dir"]))
    trained = lora_run["result"].model.eval()
    assert torch.equal(rebuilt(TOKENS), trained(TOKENS))


def test_resume_of_an_adapter_job_is_bit_identical(
    lora_run: dict[str, Any], model_roots: Path, tmp_path: Path, cpu_ctx: DistContext
) -> None:
    spec = lora_run["spec"].model_copy(update={"checkpoint_interval": None})
    resumed = train(spec, tmp_path, cpu_ctx, resume_from=step_path(lora_run["run_dir"], 2))
    straight = lora_run["result"].model
    for (name, a), (_, b) in zip(straight.named_parameters(), resumed.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    losses = [r["loss"] for r in lora_run["records"] if r["type"] == "step"]
    assert [r["loss"] for r in json_records(tmp_path) if r["type"] == "step"] == losses[2:]


def test_a_resume_onto_a_replaced_base_model_is_refused(
    lora_run: dict[str, Any], hf_model_root: Path, tmp_path: Path, cpu_ctx: DistContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An adapter checkpoint loads onto any base of the same shapes without an error: a base replaced in
    place (another checkpoint of the architecture) must refuse the resume, naming the model; the same
    files copied under another root (another host's copy) resume."""
    import shutil

    from hf_support import save_tiny_llama

    copy_root, replaced_root = tmp_path / "copy", tmp_path / "replaced"
    spec = lora_run["spec"].model_copy(update={"checkpoint_interval": None, "max_steps": 3})
    checkpoint = step_path(lora_run["run_dir"], 2)
    save_tiny_llama(replaced_root / "llama", seed=1)  # same config and shapes, other weights
    monkeypatch.setenv("HALFCAST_MODEL_ROOTS", str(replaced_root))
    with pytest.raises(TrainerError) as failure:
        train(spec, tmp_path / "refused", cpu_ctx, resume_from=checkpoint)
    assert failure.value.reason == "model_unavailable" and "the model changed" in failure.value.message
    shutil.copytree(hf_model_root / "llama", copy_root / "llama")
    monkeypatch.setenv("HALFCAST_MODEL_ROOTS", str(copy_root))
    assert train(spec, tmp_path / "resumed", cpu_ctx, resume_from=checkpoint).steps == 3


def test_a_full_fine_tune_exports_the_model_only(model_roots: Path, tmp_path: Path, cpu_ctx: DistContext) -> None:
    from transformers import AutoModelForCausalLM

    _, result, records = _train(tmp_path, cpu_ctx, adapter=None, max_steps=2)
    start = next(r for r in records if r["type"] == "start")
    assert start["model"]["trainable_parameters"] == start["model"]["parameters"]
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["model"]
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "export" / "model"))
    assert isinstance(result.model, HFModule)
    torch.testing.assert_close(_logits(merged), _logits(result.model.eval().model), rtol=0, atol=1e-5)
    assert set(torch.load(final_path(tmp_path), weights_only=True)["model"]) == set(result.model.state_dict())


def test_exports_carry_the_tokenizer_of_a_tokenized_job(
    model_roots: Path, tmp_path: Path, cpu_ctx: DistContext
) -> None:
    from transformers import AutoTokenizer

    from trainer.hf.loading import load_tokenizer

    spec = JobSpec.model_validate(lora_spec())
    parts = build_components(spec, cpu_ctx)
    config = spec.model.config
    assert isinstance(config, HFConfig) and isinstance(parts.model, HFModule)
    tokenizer = load_tokenizer(config, "jsonl")  # as a tokenized dataset gets it
    assert tokenizer is not None
    write_exports(parts.model, tokenizer, tmp_path)
    reloaded = AutoTokenizer.from_pretrained(str(tmp_path / "export" / "model"), local_files_only=True)
    assert reloaded("hello world")["input_ids"] == tokenizer("hello world")["input_ids"]
    assert json.loads((tmp_path / "export" / "adapter" / "adapter_config.json").read_text())["r"] == 4


@pytest.mark.parametrize("task", ["causal_lm", "sequence_classification"])
def test_a_tokenizer_larger_than_the_embedding_is_refused_before_training(model_roots: Path, task: str) -> None:
    """Tokens added to a tokenizer without resizing the model would index past its embedding (on CUDA a
    device-side assert at the first such token): refused up front, naming both sizes, for every task."""
    from halfcast.contracts.catalog import HFConfig
    from trainer.data.base import DataInfo, Task
    from trainer.errors import TrainerError
    from trainer.hf.loading import load_base_model, load_tokenizer

    classify = task == "sequence_classification"
    config = HFConfig(path="llama", task=task, num_labels=3 if classify else None)
    tokenizer = load_tokenizer(config, "jsonl")
    assert tokenizer is not None
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"])
    info = DataInfo(task=Task.CLASSIFICATION if classify else Task.LM, num_outputs=3 if classify else 300, seq_len=8)
    with pytest.raises(TrainerError) as failure:
        load_base_model(config, info, tokenizer)
    assert failure.value.reason == "spec_invalid" and "302 tokens" in str(failure.value) and "300" in str(failure.value)
