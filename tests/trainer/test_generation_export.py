"""Exports that stop generating (issue 25 item 8).

A tiny chat Llama (ChatML template: each turn ends with ``<|im_end|>``, not the tokenizer's EOS
``</s>``) is overfit on one conversation. Greedy generation from ``export/model`` alone (its
tokenizer, chat template and ``generation_config.json``; nothing from the job) on the training
prompt must reproduce the trained answer and stop at the end of the turn: the export's
generation config lists the template's end-of-turn token among its EOS ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_tokenizer_support import EOS, IM_END, save_chat_llama

from halfcast.contracts.spec import JobSpec
from trainer.parallel.distributed import DistContext
from trainer.run.loop import train

pytestmark = pytest.mark.slow  # overfits a model for 80 steps: not in make check

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]
ANSWER = "Paris is the capital."


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("generation")
    save_chat_llama(base / "models" / "chat-llama")
    (base / "data").mkdir()
    row = {"messages": [*PROMPT, {"role": "assistant", "content": ANSWER}]}
    (base / "data" / "chat.jsonl").write_text((json.dumps(row) + "\n") * 8)
    spec = {
        "model": {"name": "hf", "config": {"path": "chat-llama"}},
        "dataset": {"name": "jsonl", "config": {"path": "chat.jsonl", "format": "chat", "max_seq_len": 64}},
        "micro_batch_size": 4,
        "max_steps": 80,
        "optimizer": {"name": "adamw", "lr": 0.01},
        "log_interval": 40,
        "seed": 0,
    }
    mp = pytest.MonkeyPatch()
    mp.setenv("HALFCAST_MODEL_ROOTS", str(base / "models"))
    mp.setenv("HALFCAST_DATA_ROOTS", str(base / "data"))
    try:
        train(JobSpec.model_validate(spec), base / "run", DistContext(0, 0, 1, torch.device("cpu")))
    finally:
        mp.undo()
    return base / "run" / "export" / "model"


def test_greedy_generation_from_the_export_reproduces_the_answer_and_stops(export: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, BatchEncoding

    tokenizer = AutoTokenizer.from_pretrained(str(export), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(export), local_files_only=True).eval()
    prompt = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert isinstance(prompt, BatchEncoding)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=24, do_sample=False)
    new = out[0, prompt["input_ids"].shape[1] :].tolist()
    assert tokenizer.decode(new) == ANSWER + IM_END  # the answer, then the end of the turn, and nothing after


def test_the_generation_config_follows_the_tokenizer(export: Path) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(export), local_files_only=True)
    config = GenerationConfig.from_pretrained(str(export), local_files_only=True)
    ids = tokenizer.convert_tokens_to_ids([EOS, IM_END])
    assert config.eos_token_id == ids
    assert (config.bos_token_id, config.pad_token_id) == (tokenizer.bos_token_id, tokenizer.pad_token_id)
    assert tokenizer.chat_template and tokenizer.eos_token == EOS
