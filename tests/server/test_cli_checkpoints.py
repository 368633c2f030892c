"""``halfcast checkpoints`` / ``halfcast download`` and ``HalfcastClient.download_checkpoint`` against a live API (SQLite)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from api_support import insert_job
from cli_live_support import database_url_fixture, url_fixture  # noqa: F401 (the database_url and url fixtures)
from sqlalchemy.orm import Session, sessionmaker

from halfcast.cli import main
from halfcast.cli.checkpoints import format_size
from halfcast.client import HalfcastClient, NotFound, ServerUnavailable
from halfcast.core.settings import Settings
from halfcast.files.download import IncompleteDownload, save_response

FINAL = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture
def job_id(settings: Settings, sessions: sessionmaker[Session]) -> str:
    job = insert_job(sessions, status="succeeded")
    for attempt, name, data in [(1, "step-10.pt", b"ten"), (2, "step-20.pt", b"twenty"), (2, "final.pt", FINAL)]:
        path = settings.runs_dir / job / f"attempt-{attempt}" / "checkpoints" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return job


def test_checkpoints_prints_a_table_and_json(url: str, job_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoints", job_id]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ATTEMPT", "NAME", "STEP", "SIZE", "MODIFIED"]
    assert [line.split()[:4] for line in lines[1:]] == [
        ["1", "step-10.pt", "10", "3"],
        ["2", "step-20.pt", "20", "6"],
        ["2", "final.pt", "50", "1"],
    ]
    assert lines[3].split()[4] == "MiB"
    assert main(["checkpoints", job_id, "--json"]) == 0
    assert [c["name"] for c in json.loads(capsys.readouterr().out)] == ["step-10.pt", "step-20.pt", "final.pt"]


def test_download_saves_the_newest_checkpoint_and_prints_its_path(
    url: str, job_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["download", job_id]) == 0
    out, err = capsys.readouterr()
    saved = tmp_path / f"{job_id}-attempt-2-final.pt"
    assert out == f"{saved}\n" and saved.read_bytes() == FINAL
    assert "final.pt of attempt 2 (step 50, 1 MiB)" in err
    assert not list(tmp_path.glob("*.part"))


def test_download_by_name_and_attempt_to_a_file(
    url: str, job_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "ten.pt"
    assert main(["download", job_id, "--name", "step-10.pt", "--attempt", "1", "-o", str(target)]) == 0
    assert target.read_bytes() == b"ten" and capsys.readouterr().out == f"{target}\n"


def test_download_of_a_missing_checkpoint_is_a_one_line_error(
    url: str, job_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert main(["download", job_id, "--name", "step-10.pt", "--attempt", "2", "-o", str(out)]) == 1
    assert capsys.readouterr().err == f"error: job {job_id} has no checkpoint step-10.pt in attempt 2\n"
    assert main(["download", "no-such-job", "-o", str(out)]) == 1
    assert capsys.readouterr().err == "error: job no-such-job not found\n"
    assert list(out.iterdir()) == []


def test_the_client_raises_not_found_for_a_job_without_checkpoints(
    url: str, sessions: sessionmaker[Session], admin_token: str, tmp_path: Path
) -> None:
    job = insert_job(sessions, status="running")
    with (
        HalfcastClient(url, token=admin_token) as client,
        pytest.raises(NotFound, match=f"job {job} has no checkpoint$"),
    ):
        client.download_checkpoint(job, tmp_path)


def test_a_download_cut_short_leaves_no_file(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-length": "10"}, content=b"12345")

    target = tmp_path / "final.pt"
    with (
        httpx.Client(transport=httpx.MockTransport(handler)) as http,
        http.stream("GET", "http://x/f") as response,
        pytest.raises(IncompleteDownload, match="got 5 of 10 bytes"),
    ):
        save_response(response, target)
    assert list(tmp_path.iterdir()) == []


def test_the_client_reports_a_short_download_as_server_unavailable(
    url: str, job_id: str, admin_token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def short(response: httpx.Response, destination: Path) -> int:
        raise IncompleteDownload("got 1 of 2 bytes")

    monkeypatch.setattr("halfcast.client.save_response", short)
    with HalfcastClient(url, token=admin_token) as client, pytest.raises(ServerUnavailable, match="got 1 of 2 bytes"):
        client.download_checkpoint(job_id, tmp_path)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (5 * 2**30, "5 GiB"),
        (3 * 2**40, "3.07e+03 GiB"),
    ],
)
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text


def test_a_target_that_cannot_be_written_is_a_one_line_error(
    url: str, job_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "missing" / "dir" / "w.pt"
    assert main(["download", job_id, "-o", str(target)]) == 1
    assert capsys.readouterr().err == f"error: cannot save to {target}: No such file or directory\n"
    assert not (tmp_path / "missing").exists()


def test_an_output_ending_in_a_slash_is_a_directory_made_for_it(
    url: str, job_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["download", job_id, "-o", f"{tmp_path}/new/weights/"]) == 0
    saved = tmp_path / "new" / "weights" / f"{job_id}-attempt-2-final.pt"
    assert capsys.readouterr().out == f"{saved}\n" and saved.read_bytes() == FINAL


def test_checkpoints_of_a_job_without_any_says_so(
    url: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    job = insert_job(sessions, status="running")
    assert main(["checkpoints", job]) == 0
    assert capsys.readouterr() == ("", f"job {job} has no checkpoint yet\n")


def test_without_a_token_the_error_says_where_one_was_looked_for(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("HALFCAST_TOKEN")
    monkeypatch.setenv("HALFCAST_DATA_DIR", str(tmp_path / "elsewhere"))
    assert main(["list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: not authenticated:") and err.count("\n") == 1
    assert f"no token found: pass --token, set HALFCAST_TOKEN, or keep it in {tmp_path / 'elsewhere' / 'token'}" in err
    assert main(["list", "--token", "wrong"]) == 1
    assert "no token found" not in capsys.readouterr().err  # a token was sent: it is the token that is wrong
