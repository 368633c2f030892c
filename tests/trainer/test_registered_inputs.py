"""Registered datasets and models in the trainer: found under ``HALFCAST_REGISTRY_DIR`` by the ids the worker
resolved, a dataset's SHA-256 checked before a row is read (``data_unavailable`` on a mismatch), a model's
directory checked as one under a model root is; and the spec rules of ``dataset_id`` / ``model_id``."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from hf_tokenizer_support import hf_tokenizer_fixture  # noqa: F401 (the hf_tokenizer fixture)
from pydantic import ValidationError

from halfcast.contracts.catalog import HFConfig, JsonlConfig, JsonlDataset
from halfcast.contracts.spec import JobSpec
from trainer.data import build_dataset
from trainer.data.jsonl.batches import TokenFileDataset
from trainer.data.jsonl.source import dataset_path
from trainer.errors import TrainerError
from trainer.hf.loading import model_dir, tokenizer_dir
from trainer.inputs import input_fingerprints
from trainer.registered import REGISTRY_DIR_ENV

REPO = Path(__file__).resolve().parents[2]
ROWS = b"".join(json.dumps({"text": f"row number {n} of the registered file"}).encode() + b"\n" for n in range(12))
DATASET_ID = str(uuid.UUID(int=1, version=4))


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "registry"
    (root / "datasets").mkdir(parents=True)
    (root / "models").mkdir()
    monkeypatch.setenv(REGISTRY_DIR_ENV, str(root))
    monkeypatch.setenv("HALFCAST_DATA_ROOTS", "")
    return root


def _register(registry: Path, data: bytes = ROWS, file_format: str = "jsonl") -> str:
    digest = hashlib.sha256(data).hexdigest()
    (registry / "datasets" / f"{digest}.{file_format}").write_bytes(data)
    return digest


def _config(digest: str | None, **fields: Any) -> dict[str, Any]:
    return {"dataset_id": DATASET_ID, "format": "text", "file_format": "jsonl", "sha256": digest, **fields}


def test_a_resolved_registered_dataset_builds_like_a_file_under_a_data_root(hf_tokenizer, registry: Path) -> None:
    digest = _register(registry)
    dataset = build_dataset(JsonlDataset(name="jsonl", config=_config(digest)), hf_tokenizer)
    assert isinstance(dataset, TokenFileDataset)
    assert dataset.report["rows"] == 12 and dataset.report["format"] == "text"


def test_a_dataset_whose_bytes_changed_fails_data_unavailable_before_a_row_is_read(
    hf_tokenizer, registry: Path
) -> None:
    digest = _register(registry)
    path = registry / "datasets" / f"{digest}.jsonl"
    path.write_bytes(ROWS.replace(b"row number 3", b"row NUMBER 3"))
    with pytest.raises(TrainerError, match="SHA-256") as caught:
        build_dataset(JsonlDataset(name="jsonl", config=_config(digest)), hf_tokenizer)
    assert caught.value.reason == "data_unavailable" and f"dataset {DATASET_ID}" in caught.value.message


def test_a_path_dataset_with_a_sha256_is_checked_too(
    hf_tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "d.jsonl").write_bytes(ROWS)
    monkeypatch.setenv("HALFCAST_DATA_ROOTS", str(tmp_path))
    good = JsonlDataset(
        name="jsonl", config={"path": "d.jsonl", "format": "text", "sha256": hashlib.sha256(ROWS).hexdigest()}
    )
    built = build_dataset(good, hf_tokenizer)
    assert isinstance(built, TokenFileDataset) and built.report["rows"] == 12
    bad = JsonlDataset(name="jsonl", config={"path": "d.jsonl", "format": "text", "sha256": "0" * 64})
    with pytest.raises(TrainerError, match="SHA-256"):
        build_dataset(bad, hf_tokenizer)


@pytest.mark.parametrize("problem", ["missing", "link", "unresolved", "no-registry"])
def test_a_registered_dataset_that_cannot_be_read_is_refused(
    hf_tokenizer, registry: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, problem: str
) -> None:
    digest = hashlib.sha256(ROWS).hexdigest()
    config = _config(digest)
    if problem == "link":
        (tmp_path / "outside.jsonl").write_bytes(ROWS)
        (registry / "datasets" / f"{digest}.jsonl").symlink_to(tmp_path / "outside.jsonl")
    elif problem == "unresolved":
        _register(registry)
        config = {"dataset_id": DATASET_ID}
    elif problem == "no-registry":
        _register(registry)
        monkeypatch.delenv(REGISTRY_DIR_ENV)
    with pytest.raises(TrainerError) as caught:
        build_dataset(JsonlDataset(name="jsonl", config=config), hf_tokenizer)
    assert caught.value.reason == ("spec_invalid" if problem == "unresolved" else "data_unavailable"), caught.value


def test_input_fingerprints_read_the_registered_file(registry: Path, model_roots: Path) -> None:
    digest = _register(registry)
    spec = JobSpec.model_validate(
        {"model": {"name": "hf", "config": {"path": "llama"}}, "dataset": {"name": "jsonl", "config": _config(digest)}}
    )
    config = spec.dataset.config
    assert isinstance(config, JsonlConfig)
    assert dataset_path(config) == registry / "datasets" / f"{digest}.jsonl"
    assert set(input_fingerprints(spec)) == {"model", "data"}


def test_a_registered_model_is_found_by_its_id_and_checked(registry: Path, hf_model_root: Path) -> None:
    model_id = str(uuid.uuid4())
    shutil.copytree(hf_model_root / "llama", registry / "models" / model_id)
    config = HFConfig(model_id=model_id)
    assert model_dir(config) == tokenizer_dir(config) == registry / "models" / model_id
    assert not config.byte_level
    remote = str(uuid.uuid4())
    shutil.copytree(hf_model_root / "remote-code", registry / "models" / remote)
    for refused, match in ((remote, "remote code"), (str(uuid.uuid4()), "missing from the registry")):
        with pytest.raises(TrainerError, match=match) as caught:
            model_dir(HFConfig(model_id=refused))
        assert caught.value.reason == "model_unavailable"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"dataset_id": DATASET_ID, "path": "d.jsonl", "format": "text"}, "path"),
        ({}, "path"),
        ({"path": "d.jsonl"}, "format"),
        ({"dataset_id": "not-a-uuid"}, "dataset_id"),
        ({"dataset_id": DATASET_ID, "sha256": "ABC"}, "sha256"),
        ({"dataset_id": DATASET_ID, "column_map": {"a": "text"}}, "column_map"),
        ({"dataset_id": DATASET_ID, "format": "chat", "file_format": "csv"}, "file_format"),
    ],
)  # fmt: skip  # a case table, laid out by hand
def test_jsonl_config_rules_for_registered_datasets(config: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        JsonlConfig.model_validate(config)
    assert [error["loc"][0] for error in caught.value.errors()] == [field], caught.value


def test_an_unresolved_dataset_id_defers_the_format_rules() -> None:
    config = JsonlConfig(dataset_id=DATASET_ID, masking="last")
    assert (config.resolved, config.effective_masking, config.source) == (False, "last", f"dataset {DATASET_ID}")
    spec = {
        "model": {"name": "hf", "config": {"path": "m"}},
        "eval_interval": 1,
        "early_stopping": {"metric": "accuracy"},
        "dataset": {"name": "jsonl", "config": {"dataset_id": DATASET_ID}},
    }
    JobSpec.model_validate(spec)  # the API and the worker check again once the format is filled in
    with pytest.raises(ValidationError):
        JobSpec.model_validate({**spec, "dataset": {"name": "jsonl", "config": _config("0" * 64)}})


def test_hf_config_takes_exactly_one_of_path_model_id_and_hf_config() -> None:
    model_id = str(uuid.uuid4())
    for fields in (
        {"path": "m", "model_id": model_id},
        {"model_id": model_id, "hf_config": {"model_type": "llama"}},
        {},
    ):
        with pytest.raises(ValidationError, match="exactly one of path"):
            HFConfig.model_validate(fields)
    with pytest.raises(ValidationError):
        HFConfig.model_validate({"model_id": "../models/x"})


def test_the_row_checks_the_api_uses_import_no_torch() -> None:
    code = (
        "import sys\nimport trainer.data.jsonl.formats, trainer.data.jsonl.rows, trainer.data.jsonl.source\n"
        "import trainer.registered, trainer.hf.safety, trainer.hf.model_types\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
