"""An encoder (BERT) for sequence classification through the hf path: bidirectional attention with the
padding masked, a fresh classification head trained fully beside LoRA, and a jsonl classification job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from bert_support import CORPUS, save_tiny_bert
from trainer_support import json_records

from halfcast.contracts.spec import JobSpec
from trainer.components import build_components
from trainer.data.jsonl.batches import TokenFileDataset
from trainer.hf.wrapper import HFModule
from trainer.parallel.distributed import DistContext
from trainer.run.loop import train

SHORT = "the event loop runs tasks"
LONG = "an email message has headers and a payload and the http client sends a request"


@pytest.fixture(scope="module")
def bert_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model root holding ``bert/`` (:func:`bert_support.save_tiny_bert`)."""
    root = tmp_path_factory.mktemp("bert-root")
    save_tiny_bert(root / "bert")
    return root


@pytest.fixture
def roots(bert_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Model root :func:`bert_root`; a data root with ``topics.jsonl`` (4 labels, 40 rows)."""
    monkeypatch.setenv("HALFCAST_MODEL_ROOTS", str(bert_root))
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"text": f"{text} {i}", "label": label} for i in range(10) for label, text in enumerate(CORPUS)]
    (data / "topics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setenv("HALFCAST_DATA_ROOTS", str(data))
    return data


def _spec(**overrides: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "model": {"name": "hf", "config": {"path": "bert", "task": "sequence_classification", "num_labels": 4}},
        "adapter": {"r": 4, "alpha": 8, "target_modules": ["query", "value"]},
        "dataset": {
            "name": "jsonl",
            "config": {"path": "topics.jsonl", "format": "classification", "max_seq_len": 32, "test_fraction": 0.2},
        },
        "micro_batch_size": 8,
        "max_steps": 3,
        "log_interval": 1,
        "optimizer": {"lr": 0.01},
        "seed": 0,
    }
    fields.update(overrides)
    return JobSpec.model_validate(fields)


def _model(spec: JobSpec) -> tuple[HFModule, Any]:
    parts = build_components(spec, DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu")))
    assert isinstance(parts.model, HFModule)
    return parts.model.eval(), parts.tokenizer


def _encode(tokenizer: Any, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    return batch["input_ids"], batch["attention_mask"]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_logits_do_not_change_when_a_longer_neighbour_pads_the_batch(roots: Path, precision: str) -> None:
    spec = _spec(precision=precision)
    model, tokenizer = _model(spec)
    alone_ids, alone_mask = _encode(tokenizer, [SHORT])
    ids, mask = _encode(tokenizer, [SHORT, LONG])
    assert ids.shape[1] > alone_ids.shape[1] + 4 and mask[0].sum() == alone_mask.sum()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=precision == "bf16"):
        alone = model(alone_ids, alone_mask)[0].float()
        padded = model(ids, mask)[0].float()
        unmasked = model(ids, None)[0].float()
    tolerance = 1e-5 if precision == "fp32" else 1e-2
    torch.testing.assert_close(padded, alone, rtol=0, atol=tolerance)
    if precision == "fp32":  # that the padding would matter unmasked is the model's property (same weights in bf16)
        assert (unmasked - alone).abs().max() > 1e-3, "the padding would not matter: the test proves nothing"


def test_an_encoder_attends_both_ways_like_plain_transformers(roots: Path) -> None:
    model, tokenizer = _model(_spec())
    assert model.causal is False and model.architecture == "BertForSequenceClassification"
    ids, mask = _encode(tokenizer, [LONG])
    with torch.no_grad():
        ours = model(ids, mask)
        plain = model.model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).logits
    torch.testing.assert_close(ours, plain, rtol=0, atol=1e-5)


@pytest.mark.parametrize("targets", [["query", "value"], "all-linear"])
def test_lora_wraps_the_encoder_and_trains_the_fresh_head_fully(roots: Path, targets: Any) -> None:
    model, _ = _model(_spec(adapter={"r": 4, "target_modules": targets}))
    trainable = {HFModule.readable_name(n): p for n, p in model.named_parameters() if p.requires_grad}
    head = {n for n in trainable if n.startswith("classifier.")}
    assert head == {"classifier.modules_to_save.default.weight", "classifier.modules_to_save.default.bias"}
    assert all(".lora_" in n for n in trainable.keys() - head)
    wrapped = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable if ".lora_" in n}
    assert {"query", "value"} <= wrapped and ("key" in wrapped) == (targets == "all-linear")
    assert all(p.dtype == torch.float32 for p in trainable.values())


def test_a_bf16_lora_classification_job_on_an_encoder_reports_accuracy(roots: Path, tmp_path: Path) -> None:
    spec = _spec(precision="bf16", eval_interval=2)
    result = train(spec, tmp_path / "run", DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu")))
    records = json_records(tmp_path / "run")
    start = next(r for r in records if r["type"] == "start")
    evals = [r for r in records if r["type"] == "eval"]
    assert result.steps == 3 and [e["step"] for e in evals] == [2, 3]
    assert all(0.0 <= e["accuracy"] <= 1.0 for e in evals)
    assert "BertForSequenceClassification" in json.dumps(start)
    assert (tmp_path / "run" / "export" / "adapter" / "adapter_config.json").is_file()


def test_truncation_keeps_the_encoders_closing_sep(roots: Path) -> None:
    """A text cut to ``max_seq_len`` still ends with ``[SEP]`` (and starts with ``[CLS]``), as BERT saw
    every sequence in pre-training; the cut is counted."""
    spec = _spec(
        dataset={
            "name": "jsonl",
            "config": {"path": "topics.jsonl", "format": "classification", "max_seq_len": 4, "test_fraction": 0.2},
        }
    )
    parts = build_components(spec, DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu")))
    dataset, tokenizer = parts.dataset, parts.tokenizer
    assert isinstance(dataset, TokenFileDataset) and tokenizer is not None
    samples = [*dataset.train, *dataset.held_out]
    assert dataset.report["truncated"] == len(samples) == 40
    for sample in samples:
        ids = sample.inputs.tolist()
        assert len(ids) == 4 and ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id


def test_a_classification_export_names_its_labels(roots: Path, tmp_path: Path) -> None:
    """Issue 25 item 3: a job on labels given by name exported ``LABEL_0``...``LABEL_3``; its merged export's config
    now maps the class ids to the names (sorted, as the job numbered them), and a pipeline answers with them."""
    names = ["business", "science", "sports", "world"]
    rows = [{"text": f"{text} {i}", "label": names[label]} for i in range(10) for label, text in enumerate(CORPUS)]
    (roots / "named.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    spec = _spec(
        dataset={"name": "jsonl", "config": {"path": "named.jsonl", "format": "classification", "max_seq_len": 32}},
        max_steps=1,
    )
    train(spec, tmp_path / "run", DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu")))
    export = tmp_path / "run" / "export" / "model"
    config = json.loads((export / "config.json").read_text())
    assert config["id2label"] == {str(number): name for number, name in enumerate(names)}
    assert config["label2id"] == {name: number for number, name in enumerate(names)}

    from transformers import pipeline

    answer = pipeline("text-classification", model=str(export), device="cpu")(CORPUS[0])
    assert answer[0]["label"] in names
