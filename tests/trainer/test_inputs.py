"""Input fingerprints (trainer/inputs.py): a resume refuses a data file or model directory that changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hf_support import lora_spec

from halfcast.contracts.spec import JobSpec
from trainer.errors import TrainerError
from trainer.inputs import EDGE_BYTES, WHOLE_FILE_BYTES, check_inputs_unchanged, file_fingerprint, input_fingerprints


@pytest.fixture
def jsonl_spec(model_roots: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobSpec:
    """An hf job on ``d.jsonl`` under a fresh data root."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "d.jsonl").write_text('{"text": "hello world"}\n{"text": "fine-tune me"}\n')
    monkeypatch.setenv("HALFCAST_DATA_ROOTS", str(tmp_path / "data"))
    return JobSpec.model_validate(lora_spec(dataset={"name": "jsonl", "config": {"path": "d.jsonl", "format": "text"}}))


def test_an_edited_data_file_refuses_the_resume_naming_it(jsonl_spec: JobSpec, tmp_path: Path) -> None:
    saved = input_fingerprints(jsonl_spec)
    assert set(saved) == {"model", "data"}
    check_inputs_unchanged(saved, jsonl_spec, tmp_path / "step-2.pt")  # unchanged: resumes
    data = tmp_path / "data" / "d.jsonl"
    data.write_text(data.read_text().replace("hello", "howdy"))  # same size, other content
    with pytest.raises(TrainerError) as failure:
        check_inputs_unchanged(saved, jsonl_spec, tmp_path / "step-2.pt")
    assert failure.value.reason == "data_unavailable" and "the data changed" in failure.value.message


def test_a_checkpoint_without_fingerprints_resumes_as_before(jsonl_spec: JobSpec, tmp_path: Path) -> None:
    check_inputs_unchanged(None, jsonl_spec, tmp_path / "old.pt")


def test_fingerprints_ignore_where_and_when_a_file_was_copied(tmp_path: Path) -> None:
    """Size and content count, paths and modification times do not; a large file is hashed at both ends."""
    big = tmp_path / "weights.safetensors"
    big.write_bytes(b"h" * EDGE_BYTES + b"m" * (WHOLE_FILE_BYTES + 10) + b"t" * EDGE_BYTES)
    copy = tmp_path / "elsewhere" / "weights.safetensors"
    copy.parent.mkdir()
    shutil.copyfile(big, copy)  # a new modification time
    assert file_fingerprint(copy) == file_fingerprint(big)
    with big.open("r+b") as handle:
        handle.seek(big.stat().st_size - 1)
        handle.write(b"x")  # the last tensor's last byte
    assert file_fingerprint(copy) != file_fingerprint(big)
