"""``halfcast datasets ...`` / ``halfcast models ...`` and the client's uploads, against a live API (SQLite):
streamed uploads with their progress bar, listings, deletions, a bad row's exit 2, a directory with a link
refused before anything is sent, and a job's exported model registered."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from api_support import insert_job
from cli_live_support import database_url_fixture, url_fixture  # noqa: F401 (the database_url and url fixtures)
from registry_support import CHAT_ROWS, jsonl, model_files, safetensors_bytes, write_model_dir
from sqlalchemy.orm import Session, sessionmaker

from halfcast.cli import main
from halfcast.cli.progress import MIN_BYTES, UploadProgress
from halfcast.client import HalfcastClient, ValidationFailed
from halfcast.contracts.rundir import JobRuns
from halfcast.core.settings import Settings


def _out(capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_datasets_upload_list_show_delete(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sums.jsonl"
    path.write_bytes(jsonl(CHAT_ROWS))
    assert main(["datasets", "upload", str(path), "--format", "chat"]) == 0
    out, err = _out(capsys)
    dataset_id = out.strip()
    assert "6 rows of chat (jsonl)" in err
    assert main(["datasets", "list"]) == 0
    out, _ = _out(capsys)
    assert out.splitlines()[0].split() == ["ID", "NAME", "FORMAT", "ROWS", "SIZE", "CREATED"]
    assert out.splitlines()[1].split()[:4] == [dataset_id, "sums.jsonl", "chat/jsonl", "6"]
    assert main(["datasets", "show", dataset_id, "--json"]) == 0
    assert json.loads(_out(capsys)[0])["rows"] == 6
    assert main(["datasets", "delete", dataset_id]) == 0
    assert main(["datasets", "show", dataset_id]) == 1
    assert f"dataset {dataset_id} not found" in _out(capsys)[1]


def test_a_bad_row_exits_2_naming_its_line(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("text,label\na,x\n,y\n")
    assert main(["datasets", "upload", str(path), "--format", "classification"]) == 2
    assert "error: line[3].text: line 3: field text: empty" in _out(capsys)[1]
    unknown = tmp_path / "rows.txt"
    unknown.write_text("x")
    assert main(["datasets", "upload", str(unknown), "--format", "text"]) == 1
    assert "name it .jsonl, .json or .csv" in _out(capsys)[1]


def test_models_upload_list_show_delete_and_a_link_refused(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = write_model_dir(tmp_path / "tiny-llama")
    assert main(["models", "upload", str(directory)]) == 0
    out, err = _out(capsys)
    model_id = out.strip()
    assert "model tiny-llama: llama, 3 files" in err
    assert main(["models", "list"]) == 0
    assert model_id in _out(capsys)[0]
    assert main(["models", "show", model_id]) == 0
    assert "model_type:    llama" in _out(capsys)[0]
    (directory / "escape").symlink_to("/etc/passwd")
    assert main(["models", "upload", str(directory)]) == 1
    assert "holds a link" in _out(capsys)[1]
    assert main(["models", "delete", model_id]) == 0
    assert main(["models", "list"]) == 0
    assert "no model registered" in _out(capsys)[1]


def test_models_register_a_jobs_export(
    url: str, settings: Settings, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = insert_job(sessions, status="succeeded", owner="tester")
    write_model_dir(JobRuns.of(settings.runs_dir, job_id).attempt(1).export_of("model")).mkdir(exist_ok=True)
    assert main(["models", "register", job_id, "--name", "again", "--json"]) == 0
    model = json.loads(_out(capsys)[0])
    assert (model["name"], model["source_job_id"], model["files"]) == ("again", job_id, 3)


def test_the_client_streams_uploads_and_reports_progress(url: str, admin_token: str, tmp_path: Path) -> None:
    rows = [{"text": f"row {n} " + "x" * 200} for n in range((MIN_BYTES // 200) + 100)]
    path = tmp_path / "big.jsonl"
    path.write_bytes(jsonl(rows))
    seen: list[tuple[int, int]] = []
    with HalfcastClient(url, token=admin_token) as client:
        dataset = client.upload_dataset(path, "text", progress=lambda sent, total: seen.append((sent, total)))
        assert [d.id for d in client.datasets()] == [dataset.id]
        model = client.upload_model(
            write_model_dir(tmp_path / "m", model_files(None, **{"big.safetensors": safetensors_bytes(MIN_BYTES)}))
        )
        assert client.model(model.id).files == 4
        with pytest.raises(ValidationFailed) as caught:
            client.upload_dataset(path, "chat")
    assert dataset.rows == len(rows) and dataset.bytes == path.stat().st_size
    assert len(seen) > 2 and seen[-1] == (path.stat().st_size, path.stat().st_size)
    assert caught.value.errors[0].loc == ("body", "line", 1, "messages")


class _Pipe(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [True, False])
def test_the_progress_bar_shows_only_for_big_uploads(tty: bool) -> None:
    small, big = _Pipe(tty), _Pipe(tty)
    for sent in range(0, 1001, 100):
        UploadProgress("up", stream=small)(sent, 1000)
    bar = UploadProgress("up", stream=big)
    for sent in range(0, MIN_BYTES * 2 + 1, MIN_BYTES // 8):
        bar(sent, MIN_BYTES * 2)
    assert small.getvalue() == ""
    text = big.getvalue()
    assert "100%" in text and "[" + "#" * 30 + "]" in text
    assert (text.count("\r") > 10) if tty else (len(text.splitlines()) == 11)
