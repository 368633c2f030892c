"""The ``jsonl`` dataset entry: spec validation at the field (HTTP 422), torch-free imports, data-root escapes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hf_tokenizer_support import hf_tokenizer_fixture  # noqa: F401 (the hf_tokenizer fixture)
from jsonl_support import DataRoot
from pydantic import ValidationError

from halfcast.contracts.catalog import MODEL_DATASETS, JsonlDataset
from halfcast.contracts.spec import JobSpec
from trainer.errors import TrainerError

REPO = Path(__file__).resolve().parents[2]


def _error_locs(config: dict[str, Any]) -> list[tuple[Any, ...]]:
    with pytest.raises(ValidationError) as caught:
        JsonlDataset(name="jsonl", config=config)
    return [tuple(error["loc"]) for error in caught.value.errors()]


@pytest.mark.parametrize(
    ("config", "loc"),
    [
        ({"path": "../d.jsonl", "format": "text"}, ("config", "path")),
        ({"path": "a/../../d.jsonl", "format": "text"}, ("config", "path")),
        ({"path": "/etc/d.jsonl", "format": "text"}, ("config", "path")),
        ({"path": "\\\\host\\d.jsonl", "format": "text"}, ("config", "path")),
        ({"path": "d\x00.jsonl", "format": "text"}, ("config", "path")),
        ({"path": "", "format": "text"}, ("config", "path")),
        ({"path": "d.txt", "format": "text"}, ("config", "file_format")),
        ({"path": "d.csv", "format": "chat"}, ("config", "file_format")),
        ({"path": "d.jsonl", "format": "parquet"}, ("config", "format")),
        ({"path": "d.jsonl"}, ("config", "format")),
        ({"path": "d.jsonl", "format": "text", "masking": "output"}, ("config", "masking")),
        ({"path": "d.jsonl", "format": "chat", "masking": "output"}, ("config", "masking")),
        ({"path": "d.jsonl", "format": "instruction", "masking": "assistant"}, ("config", "masking")),
        ({"path": "d.jsonl", "format": "classification", "masking": "none"}, ("config", "masking")),
        ({"path": "d.jsonl", "format": "chat", "column_map": {"conversation": "text"}}, ("config", "column_map")),
        (
            {"path": "d.jsonl", "format": "instruction", "column_map": {"a": "output", "b": "output"}},
            ("config", "column_map"),
        ),
        (
            {"path": "d.jsonl", "format": "text", "column_map": {f"c{i}": "text" for i in range(17)}},
            ("config", "column_map"),
        ),
        ({"path": "d.jsonl", "format": "text", "max_seq_len": 1}, ("config", "max_seq_len")),
        ({"path": "d.jsonl", "format": "text", "max_seq_len": 10**6}, ("config", "max_seq_len")),
        ({"path": "d.jsonl", "format": "text", "test_fraction": 0.0}, ("config", "test_fraction")),
        ({"path": "d.jsonl", "format": "text", "max_bytes": 0}, ("config", "max_bytes")),
        ({"path": "d.jsonl", "format": "text", "shuffle": True}, ("config", "shuffle")),
    ],
)
def test_a_bad_jsonl_config_is_rejected_at_its_field(config: dict[str, Any], loc: tuple[Any, ...]) -> None:
    assert loc in _error_locs(config)


def test_defaults_follow_the_format_and_the_extension() -> None:
    chat = JsonlDataset(name="jsonl", config={"path": "a/b.JSONL", "format": "chat"}).config
    instruction = JsonlDataset(name="jsonl", config={"path": "b.csv", "format": "instruction"}).config
    explicit = JsonlDataset(name="jsonl", config={"path": "b.data", "format": "text", "file_format": "csv"}).config
    assert (chat.effective_masking, chat.effective_file_format, chat.max_seq_len) == ("assistant", "jsonl", 512)
    assert (instruction.effective_masking, instruction.effective_file_format) == ("output", "csv")
    assert (explicit.effective_masking, explicit.effective_file_format) == ("none", "csv")


def test_existing_models_cannot_train_on_jsonl() -> None:
    assert "jsonl" not in MODEL_DATASETS["mlp"] | MODEL_DATASETS["gpt"] and "jsonl" in MODEL_DATASETS["hf"]
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate(
            {"model": {"name": "gpt"}, "dataset": {"name": "jsonl", "config": {"path": "d.jsonl", "format": "text"}}}
        )
    assert ("dataset",) in [tuple(error["loc"]) for error in caught.value.errors()]


def test_the_spec_modules_import_neither_torch_nor_transformers() -> None:
    code = (
        "import sys, halfcast.contracts.catalog, halfcast.contracts.spec\n"
        "halfcast.contracts.catalog.JsonlDataset(name='jsonl', config={'path': 'd.jsonl', 'format': 'chat'})\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported'\n"
        "import trainer.data\n"
        "assert 'transformers' not in sys.modules, 'trainer.data imports transformers'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DataRoot:
    """A data root next to a secret dataset outside it."""
    (tmp_path / "secret.jsonl").write_text('{"text": "secret"}\n' * 3)
    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "d.jsonl").write_text('{"text": "secret"}\n' * 3)
    return DataRoot(tmp_path / "root", monkeypatch)


def _refused(hf_tokenizer, root: DataRoot, path: str, match: str) -> None:
    with pytest.raises(TrainerError, match=match) as info:
        root.build(hf_tokenizer, path, format="text")
    assert info.value.reason == "data_unavailable"


def test_a_jsonl_symlink_out_of_the_data_root_is_refused(hf_tokenizer, root: DataRoot) -> None:
    (root.path / "link.jsonl").symlink_to(root.path.parent / "secret.jsonl")
    (root.path / "up.jsonl").symlink_to(Path("..") / "secret.jsonl")
    (root.path / "sub").symlink_to(root.path.parent / "private", target_is_directory=True)
    for path in ("link.jsonl", "up.jsonl", "sub/d.jsonl"):
        _refused(hf_tokenizer, root, path, "leaves its data root")


def test_a_missing_jsonl_file_or_a_fifo_is_not_a_data_file(hf_tokenizer, root: DataRoot) -> None:
    os.mkfifo(root.path / "pipe.jsonl")
    for path in ("missing.jsonl", "pipe.jsonl"):
        _refused(hf_tokenizer, root, path, "not a file under any data root")


def test_an_empty_jsonl_file_is_unavailable(hf_tokenizer, root: DataRoot) -> None:
    _refused(hf_tokenizer, root, root.write("empty.jsonl", b""), "is empty")
