"""``halfcast exports`` / ``halfcast export`` and ``HalfcastClient.download_export``: against a live API (SQLite), and
against a fake server (``httpx.MockTransport``) answering malicious archives."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from api_support import insert_job
from cli_live_support import database_url_fixture, url_fixture  # noqa: F401 (the database_url and url fixtures)
from live_server import free_port
from sqlalchemy.orm import Session, sessionmaker

from halfcast.cli import main
from halfcast.client import HalfcastClient, HalfcastError, NotFound, ServerUnavailable
from halfcast.core.settings import Settings
from halfcast.files.export_files import Export

ADAPTER = {"adapter_config.json": b'{"r": 8}', "adapter_model.safetensors": bytes(range(256)) * 4096}  # 1 MiB
MODEL = {"config.json": b"{}", "model.safetensors": b"\x07" * 3000, "tokenizer/vocab.json": b'{"a": 1}'}


def _write(settings: Settings, job: str, attempt: int, kind: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = settings.runs_dir / job / f"attempt-{attempt}" / "export" / kind / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


@pytest.fixture
def job_id(settings: Settings, sessions: sessionmaker[Session]) -> str:
    """A succeeded job: attempt 1 wrote a model before it was lost, attempt 2 an adapter and a model."""
    job = insert_job(sessions, status="succeeded")
    _write(settings, job, 1, "model", {"config.json": b"attempt-1"})
    _write(settings, job, 2, "adapter", ADAPTER)
    _write(settings, job, 2, "model", MODEL)
    return job


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """An empty folder for what the commands write (the test's data dir is in ``tmp_path`` too)."""
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _everything(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def test_exports_prints_a_table_and_json(url: str, job_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["exports", job_id]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["KIND", "ATTEMPT", "FILES", "SIZE", "MODIFIED"]
    assert [line.split()[:5] for line in lines[1:]] == [
        ["adapter", "2", "2", "1", "MiB"],
        ["model", "2", "3", "2.94", "KiB"],
    ]
    assert main(["exports", job_id, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(e["kind"], e["attempt"], [f["name"] for f in e["files"]]) for e in listed] == [
        ("adapter", 2, sorted(ADAPTER)),
        ("model", 2, sorted(MODEL)),
    ]


def test_exports_of_a_job_without_any_says_so(
    url: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    job = insert_job(sessions, status="running")
    assert main(["exports", job]) == 0
    assert capsys.readouterr() == ("", f"job {job} has no export\n")


def test_export_unpacks_into_job_kind_in_the_current_directory(
    url: str, job_id: str, out: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(out)
    assert main(["export", job_id, "model"]) == 0
    printed, err = capsys.readouterr()
    target = out / f"{job_id}-model"
    assert printed == f"{target}\n" and _tree(target) == MODEL
    assert err == f"job {job_id}: model export, 3 files (2.94 KiB)\n"
    assert _everything(out) == sorted([target.name, *(f"{target.name}/{p}" for p in [*MODEL, "tokenizer"])])


def test_export_by_attempt_to_a_directory(url: str, job_id: str, out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = out / "deep" / "old-model"
    assert main(["export", job_id, "model", "--attempt", "1", "-o", str(target)]) == 0
    assert capsys.readouterr().out == f"{target}\n" and _tree(target) == {"config.json": b"attempt-1"}


def test_export_into_an_empty_directory_fills_it(url: str, job_id: str, out: Path) -> None:
    target = out / "empty"
    target.mkdir()
    assert main(["export", job_id, "adapter", "-o", str(target)]) == 0
    assert _tree(target) == ADAPTER


def test_export_refuses_a_directory_that_is_not_empty_unless_overwrite(
    url: str, job_id: str, out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = out / "mine"
    target.mkdir()
    (target / "keep.txt").write_bytes(b"mine")
    assert main(["export", job_id, "adapter", "-o", str(target)]) == 1
    assert capsys.readouterr().err == f"error: cannot save to {target}: it exists and is not empty (pass --overwrite)\n"
    assert _tree(target) == {"keep.txt": b"mine"} and _everything(out) == ["mine", "mine/keep.txt"]
    assert main(["export", job_id, "adapter", "-o", str(target), "--overwrite"]) == 0
    assert _tree(target) == ADAPTER and _everything(out) == ["mine", *(f"mine/{n}" for n in sorted(ADAPTER))]


def test_export_of_a_missing_export_or_job_is_a_one_line_error(
    url: str, job_id: str, out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", job_id, "adapter", "--attempt", "1", "-o", str(out / "a")]) == 1
    assert capsys.readouterr().err == f"error: job {job_id} has no adapter export in attempt 1\n"
    assert main(["export", "no-such-job", "model", "-o", str(out / "b")]) == 1
    assert capsys.readouterr().err == "error: job no-such-job not found\n"
    assert main(["exports", "no-such-job"]) == 1
    assert capsys.readouterr().err == "error: job no-such-job not found\n"
    assert list(out.iterdir()) == []


def test_export_of_an_unknown_kind_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["export", "some-job", "weights"])
    assert exited.value.code == 2 and "invalid choice: 'weights'" in capsys.readouterr().err


def test_an_unreachable_server_exits_3(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["export", "some-job", "model", "--url", url, "-o", str(out / "m")]) == 3
    assert capsys.readouterr().err.startswith(f"error: cannot reach the Halfcast API at {url}")
    assert main(["exports", "some-job", "--url", url]) == 3


def test_a_file_shrinking_mid_stream_drops_the_connection_and_leaves_nothing(
    url: str, job_id: str, settings: Settings, admin_token: str, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server has sent the headers (with the full length) when the file shrinks: the client sees a cut-short body."""
    from server.routes import exports as route

    real = route.stream_archive
    weights = settings.runs_dir / job_id / "attempt-2" / "export" / "adapter" / "adapter_model.safetensors"

    def shrinking(export: Export) -> Iterator[bytes]:
        chunks = real(export)
        yield next(chunks)  # the first header
        os.truncate(weights, 1000)
        yield from chunks

    monkeypatch.setattr(route, "stream_archive", shrinking)
    with (
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_token}"}) as http,
        pytest.raises(httpx.RemoteProtocolError),
        http.stream("GET", f"/jobs/{job_id}/exports/adapter") as response,
    ):
        assert response.status_code == 200 and int(response.headers["content-length"]) > 2**20
        response.read()
    os.truncate(weights, 0)
    weights.write_bytes(ADAPTER["adapter_model.safetensors"])
    with HalfcastClient(url, token=admin_token) as client, pytest.raises(ServerUnavailable, match="lost the download"):
        client.download_export(job_id, "adapter", out / "adapter")
    assert list(out.iterdir()) == []


def test_the_client_downloads_to_the_path_it_returns(url: str, job_id: str, admin_token: str, out: Path) -> None:
    with HalfcastClient(url, token=admin_token) as client:
        assert client.exports(job_id)[0].kind == "adapter"
        saved = client.download_export(job_id, "adapter", out / "a")
        with pytest.raises(NotFound, match="no model export in attempt 3"):
            client.download_export(job_id, "model", out / "b", attempt=3)
    assert (
        saved == out / "a"
        and _tree(saved) == ADAPTER
        and _everything(out) == ["a", "a/adapter_config.json", "a/adapter_model.safetensors"]
    )


# ----------------------------------------------------------------------------- a fake server and malicious archives


def _archive(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


def _member(
    name: str, data: bytes = b"x", kind: bytes = tarfile.REGTYPE, linkname: str = ""
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o644
    return info, data


GOOD = _member("adapter/adapter_config.json", b"{}")


def _fake_client(body: bytes, headers: dict[str, str] | None = None) -> HalfcastClient:
    """A client whose server answers every request with ``body`` as a tar."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, content=iter([body]), headers={"content-type": "application/x-tar", **(headers or {})}
        )

    client = HalfcastClient("http://fake")
    client.close()
    client._http = httpx.Client(base_url="http://fake", transport=httpx.MockTransport(handler))
    return client


MALICIOUS: dict[str, Callable[[], bytes]] = {
    "dot-dot": lambda: _archive(GOOD, _member("adapter/../../escaped")),
    "dot-dot-first": lambda: _archive(_member("../escaped"), GOOD),
    "absolute": lambda: _archive(GOOD, _member("/tmp/halfcast-escaped")),
    "symlink": lambda: _archive(GOOD, _member("adapter/link", b"", tarfile.SYMTYPE, "/etc/passwd")),
    "relative-symlink": lambda: _archive(_member("adapter/up", b"", tarfile.SYMTYPE, "../.."), GOOD),
    "hardlink": lambda: _archive(GOOD, _member("adapter/hard", b"", tarfile.LNKTYPE, "adapter/adapter_config.json")),
    "device": lambda: _archive(GOOD, _member("adapter/null", b"", tarfile.CHRTYPE)),
    "fifo": lambda: _archive(GOOD, _member("adapter/pipe", b"", tarfile.FIFOTYPE)),
    "other-kind": lambda: _archive(GOOD, _member("model/config.json")),
    "duplicate": lambda: _archive(GOOD, _member("adapter/adapter_config.json", b"again")),
    "empty-component": lambda: _archive(GOOD, _member("adapter//x")),
    "not-a-tar": lambda: b"<html>not a tar</html>" * 100,
}


@pytest.mark.parametrize("make", list(MALICIOUS.values()), ids=list(MALICIOUS))
def test_a_malicious_archive_is_refused_and_nothing_is_written(make: Callable[[], bytes], tmp_path: Path) -> None:
    body = make()
    work = tmp_path / "work"
    work.mkdir()
    with (
        _fake_client(body, {"content-length": str(len(body))}) as client,
        pytest.raises(HalfcastError, match="refused the adapter export of job j"),
    ):
        client.download_export("j", "adapter", work / "adapter")
    assert _everything(tmp_path) == ["work"]
    assert not Path("/tmp/halfcast-escaped").exists()


def test_a_good_archive_from_the_fake_server_is_unpacked(tmp_path: Path) -> None:
    """The control of the malicious cases: the same fake server, an archive of plain files and directories."""
    body = _archive(_member("adapter", b"", tarfile.DIRTYPE), GOOD, _member("adapter/sub/w.bin", b"\0" * 700))
    with _fake_client(body, {"content-length": str(len(body))}) as client:
        saved = client.download_export("j", "adapter", tmp_path / "out")
    assert (
        _tree(saved) == {"adapter_config.json": b"{}", "sub/w.bin": b"\0" * 700} and _everything(tmp_path)[0] == "out"
    )
    assert len(_everything(tmp_path)) == 4  # out, its two files and sub: no staging left


@pytest.mark.parametrize(
    ("headers", "error"),
    [({}, HalfcastError), ({"content-length": "99999"}, ServerUnavailable)],
    ids=["no-content-length", "cut-short"],
)
def test_an_archive_whose_length_cannot_be_checked_leaves_nothing(
    tmp_path: Path, headers: dict[str, str], error: type
) -> None:
    with _fake_client(_archive(GOOD), headers) as client, pytest.raises(error):
        client.download_export("j", "adapter", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
