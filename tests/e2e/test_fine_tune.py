"""Fine-tuning end to end (issue 12): a pretrained Hugging Face model and a chat file, LoRA, exports back.

A tiny Llama-style model directory (random init, with a BPE tokenizer and a chat template,
``save_pretrained`` on the fly) sits under the worker's model roots and a chat JSON-lines
file under its data roots. The job trains a LoRA adapter through the real stack (API,
Celery worker, torchrun); then the client lists and downloads both exports, and plain
transformers + PEFT load them with no Halfcast code: the merged model's logits equal the
base model with the adapter within 1e-5, and differ from the untrained base.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from e2e_support import Stack

from conftest import make_stack
from halfcast.client import HalfcastClient
from tests.trainer.hf_tokenizer_support import save_chat_llama

pytestmark = pytest.mark.e2e

CHATS = [
    [("user", f"What is {a} plus {b}?"), ("assistant", f"{a} plus {b} is {a + b}.")] for a in range(6) for b in range(4)
]


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The model root (``chat-llama/``) and the data root (``chat.jsonl``)."""
    base = tmp_path_factory.mktemp("fine-tune-roots")
    models, data = base / "models", base / "data"
    save_chat_llama(models / "chat-llama")
    data.mkdir()
    lines = [{"messages": [{"role": role, "content": text} for role, text in chat]} for chat in CHATS]
    (data / "chat.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return models, data


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, roots: tuple[Path, Path]) -> Iterator[Stack]:
    models, data = roots
    yield from make_stack(
        tmp_path_factory.mktemp("fine-tune"), model_roots=json.dumps([str(models)]), data_roots=json.dumps([str(data)])
    )


def _spec() -> dict[str, Any]:
    return {
        "name": "lora-chat",
        "model": {"name": "hf", "config": {"path": "chat-llama"}},
        "dataset": {"name": "jsonl", "config": {"path": "chat.jsonl", "format": "chat", "max_seq_len": 64}},
        "adapter": {"type": "lora", "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "precision": "fp32",
        "micro_batch_size": 4,
        "max_steps": 8,
        "optimizer": {"name": "adamw", "lr": 0.02},
        "seed": 0,
    }


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_lora_chat_job_exports_an_adapter_and_a_merged_model_that_load_without_halfcast(
    stack: Stack, roots: tuple[Path, Path], tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    job = stack.wait_terminal(stack.submit(_spec())["id"], timeout_s=240)
    assert job["status"] == "succeeded", (job["error"], stack.log_tail("worker"))
    assert job["applied_steps"] + job["skipped_steps"] == 8 and job["applied_steps"] > 0
    with HalfcastClient(str(stack.client.base_url), timeout=60, token=stack.token) as client:
        assert sorted(export.kind for export in client.exports(job["id"])) == ["adapter", "model"]
        adapter = client.download_export(job["id"], "adapter", tmp_path / "adapter")
        merged_dir = client.download_export(job["id"], "model", tmp_path / "model")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter.iterdir()}

    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(merged_dir), local_files_only=True)
    base_dir = str(roots[0] / "chat-llama")
    base = AutoModelForCausalLM.from_pretrained(base_dir, local_files_only=True).eval()
    ids = torch.tensor([tokenizer("What is 3 plus 2?")["input_ids"]])
    untrained = _logits(base, ids)
    with_adapter = _logits(PeftModel.from_pretrained(base, str(adapter)).eval(), ids)
    torch.testing.assert_close(_logits(merged, ids), with_adapter, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(with_adapter, untrained, atol=1e-4), "the adapter learned nothing"
