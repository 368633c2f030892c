"""``GET /jobs/{id}/exports`` and ``GET /jobs/{id}/exports/{kind}``: listing and downloading a job's exports.

On both backends (``database_url`` is parametrized). Exports are laid out as the
trainer writes them (``<runs_dir>/<job>/attempt-<n>/export/{adapter,model}/``), with
the temporary siblings of an export being written next to them.
"""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from api_support import FakeQueue, insert_job, make_token
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.settings import Settings
from halfcast.files import export_files
from halfcast.files.export_files import ExportKind, find_export, list_exports
from halfcast.files.export_tar import ExportChanged, archive_size, stream_archive
from server.app import create_app
from server.auth import SESSION_COOKIE

ADAPTER = {"adapter_config.json": b'{"r": 8}', "adapter_model.safetensors": bytes(range(256)) * 9}
MODEL = {
    "config.json": b"{}",
    "model-00001-of-00002.safetensors": b"\x01" * 512,
    "model-00002-of-00002.safetensors": b"\x02" * 513,
    "model.safetensors.index.json": b'{"weight_map": {}}',
    "tokenizer.json": b"",
    "generation_config.json": b"{ }",
}


def write_export(settings: Settings, job_id: str, attempt: int, name: str, files: dict[str, bytes]) -> Path:
    """Write ``files`` (relative names) into ``attempt-<n>/export/<name>/``; the folder."""
    folder = settings.runs_dir / job_id / f"attempt-{attempt}" / "export" / name
    for relative, data in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def job_id(settings: Settings, sessions: sessionmaker[Session]) -> str:
    """A succeeded job: attempt 1 (lost after writing a model) and 2 exported; attempt 3 never got far; writes in flight."""
    job = insert_job(sessions, status="succeeded")
    write_export(settings, job, 1, "model", {"config.json": b"attempt-1"})
    write_export(settings, job, 2, "adapter", ADAPTER)
    write_export(settings, job, 2, "model", MODEL)
    write_export(settings, job, 2, ".adapter.tmp-123", {"adapter_config.json": b"partial"})
    write_export(settings, job, 3, ".model.tmp-9", {"config.json": b"partial"})
    (settings.runs_dir / job / "attempt-3" / "logs").mkdir(parents=True)
    return job


def _untar(body: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
    """Every member of the archive ``body`` with its bytes."""
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:") as archive:
        return [(m, _member_bytes(archive, m)) for m in archive.getmembers()]


def _member_bytes(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    """A member's content (``extractfile`` gives None only for what is not a regular file or a link)."""
    file = archive.extractfile(member)
    assert file is not None, member.name
    return file.read()


def test_the_list_holds_each_kind_from_the_newest_attempt_that_has_it(client: TestClient, job_id: str) -> None:
    response = client.get(f"/jobs/{job_id}/exports")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["job_id"] == job_id
    listed = [(e["kind"], e["attempt"], e["size_bytes"], e["url"]) for e in body["exports"]]
    assert listed == [
        ("adapter", 2, sum(map(len, ADAPTER.values())), f"/jobs/{job_id}/exports/adapter?attempt=2"),
        ("model", 2, sum(map(len, MODEL.values())), f"/jobs/{job_id}/exports/model?attempt=2"),
    ]
    assert body["exports"][1]["files"] == [{"name": n, "size_bytes": len(MODEL[n])} for n in sorted(MODEL)]
    assert all(e["modified_at"].endswith(("Z", "+00:00")) for e in body["exports"])


CHECK = {"rows": 4, "dtype": "bfloat16", "max_logit_difference": 0.00018, "tolerance": 0.05}


@pytest.mark.parametrize(
    ("metadata", "listed"),
    [
        (json.dumps({"base": {"path": "llama"}, "check": CHECK}).encode(), CHECK),
        (json.dumps({"base": {"path": "llama"}}).encode(), None),  # an export written before the check
        (b"{not json", None),
        (json.dumps({"check": {**CHECK, "max_logit_difference": -1}}).encode(), None),
        (json.dumps({"check": CHECK}).encode() + b" " * (70 << 10), None),  # past the size read
    ],
    ids=["recorded", "none", "not-json", "invalid", "too-large"],
)
def test_the_model_export_lists_its_recorded_check(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], metadata: bytes, listed: object
) -> None:
    """Issue 25 item 2: the merged export's check (halfcast_export.json) is listed; a bad file is no check."""
    job = insert_job(sessions, status="succeeded")
    write_export(settings, job, 1, "model", {**MODEL, "halfcast_export.json": metadata})
    write_export(settings, job, 1, "adapter", {**ADAPTER, "halfcast_export.json": metadata})
    exports = {e["kind"]: e for e in client.get(f"/jobs/{job}/exports").json()["exports"]}
    assert exports["model"]["check"] == listed and exports["adapter"]["check"] is None


@pytest.mark.parametrize("name", [".adapter.tmp-123", "adapter.tmp", "ADAPTER", "models", "notes"])
def test_nothing_but_a_directory_named_adapter_or_model_is_listed_or_served(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], name: str
) -> None:
    job = insert_job(sessions, status="succeeded")
    write_export(settings, job, 1, name, ADAPTER)
    (settings.runs_dir / job / "attempt-1" / "export" / "model.json").write_bytes(b"a file, not a directory")
    assert client.get(f"/jobs/{job}/exports").json() == {"job_id": job, "exports": []}
    assert client.get(f"/jobs/{job}/exports/adapter").status_code == 404


def test_a_job_without_exports_lists_none(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job = insert_job(sessions, status="running")
    assert client.get(f"/jobs/{job}/exports").json() == {"job_id": job, "exports": []}


def test_a_download_is_a_tar_of_the_files_byte_for_byte(client: TestClient, job_id: str, settings: Settings) -> None:
    response = client.get(f"/jobs/{job_id}/exports/model")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-tar"
    assert response.headers["content-length"] == str(len(response.content))
    assert response.headers["content-disposition"] == f'attachment; filename="{job_id}-model.tar"'
    assert response.headers["x-halfcast-attempt"] == "2"
    members = _untar(response.content)
    assert [m.name for m, _ in members] == [f"model/{n}" for n in sorted(MODEL)]
    folder = settings.runs_dir / job_id / "attempt-2" / "export" / "model"
    for member, data in members:
        name = member.name.removeprefix("model/")
        assert data == MODEL[name]
        assert (member.type, member.mode, member.uid, member.gid, member.uname, member.gname) == (
            tarfile.REGTYPE,
            0o644,
            0,
            0,
            "",
            "",
        )
        assert member.mtime == int((folder / name).stat().st_mtime)
    assert response.content.endswith(bytes(1024))


def test_the_archive_is_the_same_every_time(client: TestClient, job_id: str) -> None:
    first, second = (client.get(f"/jobs/{job_id}/exports/adapter").content for _ in range(2))
    assert first == second


@pytest.mark.parametrize(
    "files",
    [{}, {"a": b""}, {"block": b"x" * 512}, {"over": b"x" * 513}, {"n" * 99: b"1", "sub/" + "d" * 150 + "/f": b"22"},
     {"dépôt/modèle.json": b"{}", "日本.bin": b"\0" * 1000}],
    ids=["empty", "empty-file", "one-block", "block-and-a-byte", "long-names", "unicode-names"],
)  # fmt: skip  # a case table, laid out by hand
def test_content_length_is_exact(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], files: dict[str, bytes]
) -> None:
    job = insert_job(sessions, status="succeeded")
    write_export(settings, job, 1, "adapter", files)
    response = client.get(f"/jobs/{job}/exports/adapter")
    assert response.status_code == 200, response.text
    assert int(response.headers["content-length"]) == len(response.content)
    assert {m.name.removeprefix("adapter/"): data for m, data in _untar(response.content)} == files


def test_head_answers_the_headers_of_a_download_without_its_body(client: TestClient, job_id: str) -> None:
    got = client.get(f"/jobs/{job_id}/exports/adapter")
    head = client.head(f"/jobs/{job_id}/exports/adapter")
    assert head.status_code == 200 and head.content == b""
    for header in ("content-length", "content-type", "content-disposition", "x-halfcast-attempt"):
        assert head.headers[header] == got.headers[header]
    assert client.head(f"/jobs/{job_id}/exports/adapter", params={"attempt": 1}).status_code == 404


def test_attempt_picks_an_earlier_attempts_export(client: TestClient, job_id: str) -> None:
    response = client.get(f"/jobs/{job_id}/exports/model", params={"attempt": 1})
    assert response.headers["x-halfcast-attempt"] == "1"
    assert [(m.name, data) for m, data in _untar(response.content)] == [("model/config.json", b"attempt-1")]


@pytest.mark.parametrize(
    ("kind", "params", "where"),
    [("adapter", {"attempt": 1}, "attempt 1"), ("model", {"attempt": 3}, "attempt 3"), ("model", {"attempt": 9}, "attempt 9")],
    ids=["not-in-that-attempt", "only-a-temporary-one", "no-such-attempt"],
)  # fmt: skip  # a case table, laid out by hand
def test_a_missing_export_is_a_404(
    client: TestClient, job_id: str, kind: str, params: dict[str, int], where: str
) -> None:
    response = client.get(f"/jobs/{job_id}/exports/{kind}", params=params)
    assert response.status_code == 404, response.text
    assert response.json() == {"detail": f"job {job_id} has no {kind} export in {where}", "job_id": job_id}


def test_a_job_without_exports_has_no_download(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job = insert_job(sessions, status="succeeded")
    response = client.get(f"/jobs/{job}/exports/model")
    assert response.status_code == 404 and response.json()["detail"] == f"job {job} has no model export in any attempt"


@pytest.mark.parametrize(
    "kind", ["weights", "ADAPTER", ".adapter.tmp-123", "adapter.tar", "model%00", "%2E%2E", "export"]
)
def test_a_kind_that_is_not_adapter_or_model_is_a_422_naming_it(client: TestClient, job_id: str, kind: str) -> None:
    response = client.get(f"/jobs/{job_id}/exports/{kind}")
    assert response.status_code in (404, 422), response.text
    if response.status_code == 422:
        assert response.json()["detail"][0]["loc"] == ["path", "kind"]
    else:  # the router did not match a single path segment: no route, not an export
        assert "export" not in response.text


def test_attempt_zero_is_a_422(client: TestClient, job_id: str) -> None:
    response = client.get(f"/jobs/{job_id}/exports/model", params={"attempt": 0})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["query", "attempt"]


def test_an_unknown_job_is_a_404(client: TestClient) -> None:
    for path in ("/jobs/nope/exports", "/jobs/nope/exports/model"):
        response = client.get(path)
        assert response.status_code == 404 and response.json() == {"detail": "job nope not found", "job_id": "nope"}


def test_another_owners_job_is_exactly_a_missing_one_on_get_and_head(
    client: TestClient, settings: Settings, database_url: str, sessions: sessionmaker[Session]
) -> None:
    job = insert_job(sessions, status="succeeded", owner="alice")
    write_export(settings, job, 1, "adapter", ADAPTER)
    bob = {"Authorization": f"Bearer {make_token(database_url, 'bob')}"}
    alice = {"Authorization": f"Bearer {make_token(database_url, 'alice')}"}
    assert client.head(f"/jobs/{job}/exports/adapter", headers=alice).status_code == 200
    for method in ("GET", "HEAD"):
        response = client.request(method, f"/jobs/{job}/exports/adapter", headers=bob)
        assert response.status_code == 404 and "x-halfcast-attempt" not in response.headers
    assert client.get(f"/jobs/{job}/exports", headers=bob).json() == {"detail": f"job {job} not found", "job_id": job}


def test_the_session_cookie_downloads_an_export(settings: Settings, admin_token: str, job_id: str) -> None:
    with TestClient(create_app(settings, FakeQueue()), cookies={SESSION_COOKIE: admin_token}) as browser:
        assert browser.get(f"/jobs/{job_id}/exports").status_code == 200
        response = browser.get(f"/jobs/{job_id}/exports/adapter")
        assert response.status_code == 200 and len(response.content) == int(response.headers["content-length"])
        assert browser.head(f"/jobs/{job_id}/exports/adapter").status_code == 200


SECRET = b"the API host's secret"


def _plant(folder: Path, how: str, outside: Path) -> None:
    """Put something that is not a plain file or directory into ``folder`` (an export), ``how``."""
    if how == "file-link":
        (folder / "config.json").unlink()
        (folder / "config.json").symlink_to(outside / "secret")
    elif how == "dir-link":
        (folder / "tokenizer").symlink_to(outside)
    elif how == "dangling-link":
        (folder / "gone.json").symlink_to(outside / "nothing-here")
    elif how == "fifo":
        os.mkfifo(folder / "pipe")
    elif how == "kind-link":
        target = outside / "fake-model"
        target.mkdir()
        (target / "secret").write_bytes(SECRET)
        os.rename(folder, folder.with_name("old-model"))
        folder.symlink_to(target)
    elif how == "export-link":
        target = outside / "fake-export"
        (target / "model").mkdir(parents=True)
        (target / "model" / "secret").write_bytes(SECRET)
        os.rename(folder.parent, folder.parent.with_name("old-export"))
        folder.parent.symlink_to(target)


@pytest.mark.parametrize("how", ["file-link", "dir-link", "dangling-link", "fifo", "kind-link", "export-link"])
def test_an_export_holding_a_link_or_special_file_is_refused_and_never_followed(
    client: TestClient, job_id: str, settings: Settings, tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    _plant(settings.runs_dir / job_id / "attempt-2" / "export" / "model", how, outside)
    listed = {(e["kind"], e["attempt"]) for e in client.get(f"/jobs/{job_id}/exports").json()["exports"]}
    assert ("model", 2) not in listed
    response = client.get(f"/jobs/{job_id}/exports/model", params={"attempt": 2})
    assert response.status_code == 404 and SECRET not in response.content
    if how != "export-link":  # a linked export/ holds no adapter either
        assert ("adapter", 2) in listed
    if how not in ("kind-link", "export-link"):
        assert "refusing export" in caplog.text


@pytest.mark.parametrize(
    ("limit", "value", "files"),
    [("MAX_FILES", 3, {"a": b"", "b": b"", "c": b"", "d": b""}), ("MAX_DEPTH", 2, {"a/b/c/f": b"deep"})],
)
def test_an_export_past_the_limits_is_refused(
    settings: Settings,
    sessions: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
    limit: str,
    value: int,
    files: dict[str, bytes],
) -> None:
    job = insert_job(sessions, status="succeeded")
    write_export(settings, job, 1, "adapter", files)
    assert [e.kind for e in list_exports(settings.runs_dir, job)] == [ExportKind.ADAPTER]
    monkeypatch.setattr(export_files, limit, value)
    assert list_exports(settings.runs_dir, job) == []


def test_an_export_at_the_limits_is_served(
    settings: Settings, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = insert_job(sessions, status="succeeded")
    write_export(settings, job, 1, "adapter", {"a/b/f": b"", "c": b"", "d": b""})
    monkeypatch.setattr(export_files, "MAX_FILES", 3)
    monkeypatch.setattr(export_files, "MAX_DEPTH", 2)
    assert [f.name for f in list_exports(settings.runs_dir, job)[0].files] == ["a/b/f", "c", "d"]


def _replace_by_link(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.with_name("config.json"))


@pytest.mark.parametrize(
    ("change", "message"),
    [(lambda p: os.truncate(p, 100), "no longer a regular file of 513"),
     (lambda p: p.write_bytes(b"\x02" * 600), "no longer a regular file of 513"),
     (lambda p: p.unlink(), "cannot be opened"), (_replace_by_link, "cannot be opened")],
    ids=["shrinks", "grows", "vanishes", "becomes-a-link"],
)  # fmt: skip  # a case table, laid out by hand
def test_a_file_that_changes_before_it_is_sent_aborts_the_archive(
    job_id: str, settings: Settings, caplog: pytest.LogCaptureFixture, change: Callable[[Path], object], message: str
) -> None:
    export = find_export(settings.runs_dir, job_id, ExportKind.MODEL)
    assert export is not None
    chunks = stream_archive(export)
    sent = next(chunks) + next(chunks)  # the first header and file
    change(export.path / "model-00002-of-00002.safetensors")
    with pytest.raises(ExportChanged, match=message), caplog.at_level(logging.ERROR):
        for chunk in chunks:
            sent += chunk
    assert len(sent) < archive_size(export) and not sent.endswith(bytes(1024))
    assert "aborted the archive" in caplog.text and str(export.path) in caplog.text


def test_a_file_that_shrinks_while_it_is_read_aborts_the_archive(
    job_id: str, settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("halfcast.files.export_tar.CHUNK_BYTES", 128)
    export = find_export(settings.runs_dir, job_id, ExportKind.MODEL)
    assert export is not None
    chunks = stream_archive(export)
    while not next(chunks).startswith(b"model/model-00002-of-00002.safetensors"):
        pass
    assert next(chunks) == b"\x02" * 128
    os.truncate(export.path / "model-00002-of-00002.safetensors", 200)
    assert next(chunks) == b"\x02" * 72
    with pytest.raises(ExportChanged, match="shrank: only 200 of its 513 bytes"):
        next(chunks)
    assert "aborted the archive" in caplog.text


def test_a_file_that_grows_while_it_is_read_aborts_the_archive(job_id: str, settings: Settings) -> None:
    export = find_export(settings.runs_dir, job_id, ExportKind.ADAPTER)
    assert export is not None
    chunks = stream_archive(export)
    assert next(chunks).startswith(b"adapter/adapter_config.json") and next(chunks) == ADAPTER["adapter_config.json"]
    with (export.path / "adapter_config.json").open("ab") as handle:  # grows after its listed bytes were read
        handle.write(b"more")
    with pytest.raises(ExportChanged, match="grew past 8 bytes"):
        list(chunks)
