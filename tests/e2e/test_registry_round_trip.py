"""Registered inputs end to end (issue 15), on the embedded stack (SQLite + filesystem broker) and on PostgreSQL +
Redis: a chat file and a tiny Llama are uploaded (neither is under a worker root), a LoRA job trains on them by id,
its exported model is registered in one call, and a second job fine-tunes that registered model again. The runs'
``spec.json`` carry the dataset's SHA-256, the stored specs only the ids; a dataset whose bytes change under the
registry fails its next job ``data_unavailable``; a dataset a running job uses cannot be deleted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import Stack

from conftest import make_stack
from halfcast.client import Conflict, HalfcastClient
from tests.trainer.hf_tokenizer_support import save_chat_llama

pytestmark = pytest.mark.e2e

CHATS = [
    [("user", f"What is {a} plus {b}?"), ("assistant", f"{a} plus {b} is {a + b}.")] for a in range(5) for b in range(4)
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny chat Llama directory and a chat JSON-lines file, outside any data or model root."""
    base = tmp_path_factory.mktemp("registry-inputs")
    model = save_chat_llama(base / "chat-llama")
    rows = [{"messages": [{"role": role, "content": text} for role, text in chat]} for chat in CHATS]
    data = base / "chat.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return model, data


@pytest.fixture(
    scope="module", params=["embedded", pytest.param("services", marks=[pytest.mark.postgres, pytest.mark.redis])]
)
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    services: dict[str, str] = {}
    if request.param == "services":
        services = {
            "database_url": request.getfixturevalue("postgres_url"),
            "broker_url": request.getfixturevalue("redis_url"),
        }
    yield from make_stack(tmp_path_factory.mktemp(f"registry-{request.param}"), 1, **services)


def _spec(name: str, model_id: str, dataset_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"name": "hf", "config": {"model_id": model_id}},
        "dataset": {"name": "jsonl", "config": {"dataset_id": dataset_id, "max_seq_len": 64}},
        "adapter": {"type": "lora", "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "precision": "fp32",
        "micro_batch_size": 4,
        "max_steps": 4,
        "optimizer": {"lr": 0.02},
        "seed": 0,
        **fields,
    }


def _succeeded(stack: Stack, job_id: str) -> dict[str, Any]:
    job = stack.wait_terminal(job_id, timeout_s=300)
    assert job["status"] == "succeeded", (job["error"], stack.log_tail("worker"))
    return job


def _run_spec(stack: Stack, job_id: str) -> dict[str, Any]:
    return json.loads((stack.data_dir / "runs" / job_id / "attempt-1" / "spec.json").read_text())


def test_upload_train_register_and_fine_tune_the_registered_model_again(
    stack: Stack, inputs: tuple[Path, Path]
) -> None:
    model_dir, data = inputs
    with HalfcastClient(str(stack.client.base_url), timeout=60, token=stack.token) as client:
        dataset = client.upload_dataset(data, "chat")
        base = client.upload_model(model_dir, name="chat-llama")
        assert (dataset.rows, base.model_type) == (len(CHATS), "llama")

        first = stack.submit(_spec("round-1", base.id, dataset.id))
        with pytest.raises(Conflict):  # the job names it and has not ended
            client.delete_dataset(dataset.id)
        _succeeded(stack, first["id"])
        assert {e.kind for e in client.exports(first["id"])} == {"adapter", "model"}
        tuned = client.register_export(first["id"], name="chat-llama-tuned")
        assert (tuned.source_job_id, tuned.model_type) == (first["id"], "llama")

        second = stack.submit(_spec("round-2", tuned.id, dataset.id, adapter=None, max_steps=3))
        job = _succeeded(stack, second["id"])
        assert job["applied_steps"] + job["skipped_steps"] == 3
        assert job["spec"]["dataset"]["config"]["sha256"] is None  # stored as submitted
        run = _run_spec(stack, second["id"])["dataset"]["config"]
        assert (run["sha256"], run["format"], run["file_format"]) == (dataset.sha256, "chat", "jsonl")
        merged = stack.data_dir / "registry" / "models" / tuned.id
        assert (merged / "config.json").is_file() and list(merged.glob("*.safetensors"))

        client.delete_model(base.id)
        assert [m.id for m in client.models()] == [tuned.id]


def test_a_dataset_whose_bytes_changed_fails_the_next_job(
    stack: Stack, inputs: tuple[Path, Path], tmp_path: Path
) -> None:
    model_dir, data = inputs
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(data.read_bytes().replace(b"What is 1", b"What is 9"))
    with HalfcastClient(str(stack.client.base_url), timeout=60, token=stack.token) as client:
        dataset = client.upload_dataset(copy, "chat")
        model = client.upload_model(model_dir)
    stored = stack.data_dir / "registry" / "datasets" / f"{dataset.sha256}.jsonl"
    stored.write_bytes(stored.read_bytes().replace(b"plus", b"PLUS", 1))
    job = stack.wait_terminal(stack.submit(_spec("tampered", model.id, dataset.id))["id"], timeout_s=300)
    assert job["status"] == "failed" and job["error"]["reason"] == "data_unavailable", job["error"]
    assert dataset.sha256 in job["error"]["message"]
