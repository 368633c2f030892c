"""``/models`` on SQLite and PostgreSQL: a model directory uploaded as a tar, checked entry by entry (tar slip,
links, devices, pickle weights, remote code, an unsupported model type) before anything is stored; owner
isolation, audit, the storage quota, deletion, job specs naming ``model_id``, and a job's exported model
registered in one call."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_support import FakeQueue, insert_job, make_token
from fastapi.testclient import TestClient
from registry_support import (
    LLAMA_CONFIG,
    Entry,
    audit_actions,
    model_files,
    model_tar,
    registry_counts,
    safetensors_bytes,
    stored_files,
    tar_of,
    write_model_dir,
)
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from halfcast.contracts.rundir import JobRuns
from halfcast.core.db.models import Job
from halfcast.core.settings import Settings
from server.app import create_app

TAR = {"content-type": "application/x-tar"}


def upload(client: TestClient, body: bytes, headers: dict[str, str] = TAR, **params: Any) -> Any:
    return client.post("/models", params=params, content=body, headers=headers)


def job_spec(model_id: str) -> dict[str, Any]:
    return {
        "model": {"name": "hf", "config": {"model_id": model_id}},
        "dataset": {"name": "jsonl", "config": {"path": "chat.jsonl", "format": "chat"}},
        "max_steps": 2,
    }


@pytest.fixture
def alice(database_url: str, settings: Settings, fake_queue: FakeQueue) -> Iterator[TestClient]:
    token = make_token(database_url, "alice")
    with TestClient(create_app(settings, fake_queue), headers={"Authorization": f"Bearer {token}"}) as test_client:
        yield test_client


@pytest.mark.parametrize("prefix", ["", "model", "./"])
def test_a_model_tar_is_checked_extracted_and_registered(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], prefix: str
) -> None:
    files = model_files(None, **{"sub__vocab.txt": b"a\nb\n"})
    answer = upload(client, model_tar(files, prefix.rstrip("/") if prefix != "./" else "."), name="tiny")
    assert answer.status_code == 201, answer.text
    model = answer.json()
    assert {k: model[k] for k in ("name", "model_type", "files", "bytes", "source_job_id", "owner")} == {
        "name": "tiny",
        "model_type": "llama",
        "files": 4,
        "bytes": sum(map(len, files.values())),
        "source_job_id": None,
        "owner": "tester",
    }
    directory = settings.registry_dir / "models" / model["id"]
    assert {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()} == files
    assert answer.headers["location"] == f"/models/{model['id']}"
    assert client.get(f"/models/{model['id']}").json() == model
    assert client.get("/models").json() == {"models": [model], "next_cursor": None}
    assert audit_actions(sessions, "model.") == [("model.create", "tester", model["id"])]


def _refused(
    entries: list[Entry] | None = None, files: dict[str, bytes] | None = None, raw: bytes | None = None
) -> bytes:
    if raw is not None:
        return raw
    return model_tar(files, extra=entries or [])


REFUSED = {
    "absolute": (_refused([Entry("/etc/evil", b"x")]), "absolute"),
    "dot-dot": (_refused([Entry("../evil", b"x")]), "'..'"),
    "inner-dot-dot": (_refused([Entry("a/../../evil", b"x")]), "'..'"),
    "symlink": (_refused([Entry("link", kind=tarfile.SYMTYPE, target="/etc/passwd")]), "links"),
    "hardlink": (_refused([Entry("hard", kind=tarfile.LNKTYPE, target="config.json")]), "links"),
    "device": (_refused([Entry("dev", kind=tarfile.CHRTYPE)]), "regular files and directories"),
    "fifo": (_refused([Entry("fifo", kind=tarfile.FIFOTYPE)]), "regular files and directories"),
    "duplicate": (_refused([Entry("config.json", b"{}")]), "twice"),
    "deep": (_refused([Entry("/".join("d" * 10) + "/f", b"x")]), "deeper"),
    "pickle-bin": (_refused([Entry("pytorch_model.bin", b"x")]), "pickle"),
    "pickle-pt": (_refused([Entry("sub/weights.PT", b"x")]), "pickle"),
    "only-pickle": (_refused(files={"config.json": json.dumps(LLAMA_CONFIG).encode(), "w.pkl": b"x"}), "pickle"),
    "no-weights": (_refused(files={"config.json": json.dumps(LLAMA_CONFIG).encode()}), "safetensors"),
    "no-config": (_refused(files={"model.safetensors": b"x"}), "config.json"),
    "auto-map": (_refused(files=model_files({**LLAMA_CONFIG, "auto_map": {"AutoModel": "evil.Model"}})), "remote code"),
    "tokenizer-auto-map": (
        _refused(files={**model_files(), "tokenizer_config.json": b'{"auto_map": {}}'}),
        "remote code",
    ),
    "unsupported-type": (_refused(files=model_files({"model_type": "evil_arch"})), "not supported"),
    "no-type": (_refused(files=model_files({"hidden_size": 8})), "not supported"),
    "bad-json": (_refused(files={**model_files(), "config.json": b"{nope"}), "not valid JSON"),
    "config-not-object": (_refused(files={**model_files(), "config.json": b"[1]"}), "JSON object"),
    "two-tops": (tar_of([Entry("a/config.json", b"{}"), Entry("b/model.safetensors", b"x")]), "config.json"),
    # issue 24 item 8: weights are what they claim (the header parsed at upload, no tensor loaded)
    "renamed-pickle": (
        _refused(files=model_files(None, **{"model.safetensors": b"\x80\x04\x95" + b"pickled" * 20})),
        "model.safetensors",
    ),
    "truncated-weights": (
        _refused(files=model_files(None, **{"model.safetensors": safetensors_bytes()[:-1]})),
        "tensors span",
    ),
    "bad-nested-weights": (_refused(files=model_files(None, **{"sub__extra__w.safetensors": b"\0" * 12})), "sub/extra"),
    "not-a-tar": (b"this is not a tar archive" * 40, "tar"),
    "gzip": (b"\x1f\x8b\x08\x00" + b"\0" * 600, "tar"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refused_archive_is_a_422_naming_why_and_stores_nothing(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], case: str
) -> None:
    body, fragment = REFUSED[case]
    answer = upload(client, body)
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["detail"]
    assert error["loc"][0] == "body" and fragment in error["msg"], error
    assert registry_counts(sessions) == (0, 0) and stored_files(settings.registry_dir) == []
    assert not (settings.data_dir / "evil").exists() and not Path("/etc/evil").exists()


def test_the_wrong_media_type_is_a_415_and_an_oversize_archive_a_413(
    settings: Settings, fake_queue: FakeQueue, auth_headers: dict[str, str], sessions: sessionmaker[Session]
) -> None:
    body = model_tar()
    limited = settings.model_copy(update={"max_upload_bytes": len(body) - 1})
    with TestClient(create_app(limited, fake_queue), headers=auth_headers) as small:
        assert upload(small, body[:512], {"content-type": "application/gzip"}).status_code == 415
        assert upload(small, body).status_code == 413
        assert small.post("/models", content=iter([body]), headers=TAR).status_code == 413
    assert registry_counts(sessions) == (0, 0) and stored_files(settings.registry_dir) == []


def test_the_storage_quota_counts_models_and_datasets(
    settings: Settings, fake_queue: FakeQueue, auth_headers: dict[str, str], sessions: sessionmaker[Session]
) -> None:
    size = sum(map(len, model_files().values()))
    limited = settings.model_copy(update={"quota_max_storage_bytes": size + 10})
    with TestClient(create_app(limited, fake_queue), headers=auth_headers) as client:
        assert upload(client, model_tar()).status_code == 201
        data = client.post(
            "/datasets",
            params={"format": "text"},
            content=b'{"text": "0123456789ab"}\n',
            headers={"content-type": "application/jsonl"},
        )
        refused = client.post("/models", content=iter([model_tar()]), headers=TAR)
    assert (data.status_code, refused.status_code) == (429, 429)
    assert refused.json()["limit"] == "max_storage_bytes"
    assert registry_counts(sessions) == (0, 1) and len(stored_files(settings.registry_dir)) == 1 + 3  # dir + files


def test_isolation_delete_and_jobs_naming_a_model(
    client: TestClient, alice: TestClient, settings: Settings, sessions: sessionmaker[Session]
) -> None:
    mine = upload(alice, model_tar()).json()
    theirs = upload(client, model_tar()).json()
    assert alice.get(f"/models/{theirs['id']}").status_code == 404
    assert alice.delete(f"/models/{theirs['id']}").status_code == 404
    assert [m["id"] for m in alice.get("/models").json()["models"]] == [mine["id"]]
    refused = alice.post("/jobs", json=job_spec(theirs["id"]))
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "model", "hf", "config", "model_id"]
    job = alice.post("/jobs", json=job_spec(mine["id"]))
    assert job.status_code == 201, job.text
    busy = alice.delete(f"/models/{mine['id']}")
    assert busy.status_code == 409 and job.json()["id"] in busy.json()["detail"]
    with sessions() as session:
        session.execute(update(Job).values(status="cancelled"))
        session.commit()
    assert alice.delete(f"/models/{mine['id']}").status_code == 204
    assert not (settings.registry_dir / "models" / mine["id"]).exists()
    assert client.delete(f"/models/{theirs['id']}").status_code == 204  # the admin
    assert registry_counts(sessions) == (0, 0) and stored_files(settings.registry_dir) == []
    assert [(a, actor) for a, actor, _ in audit_actions(sessions, "model.")] == [
        ("model.create", "alice"),
        ("model.create", "tester"),
        ("model.delete", "alice"),
        ("model.delete", "tester"),
    ]


def test_a_spec_with_model_id_and_path_is_a_422(client: TestClient) -> None:
    model = upload(client, model_tar()).json()
    spec = job_spec(model["id"])
    spec["model"]["config"]["path"] = "tiny"
    answer = client.post("/jobs", json=spec)
    assert answer.status_code == 422 and "exactly one of path" in answer.text


def _succeeded_job_with_export(
    sessions: sessionmaker[Session], settings: Settings, owner: str, files: dict[str, bytes] | None = None
) -> str:
    job_id = insert_job(sessions, status="succeeded", owner=owner)
    export = JobRuns.of(settings.runs_dir, job_id).attempt(1).export_of("model")
    export.mkdir(parents=True)
    write_model_dir(export, files)
    return job_id


def test_a_jobs_exported_model_is_registered_for_the_jobs_owner(
    client: TestClient, alice: TestClient, settings: Settings, sessions: sessionmaker[Session]
) -> None:
    job_id = _succeeded_job_with_export(sessions, settings, "alice")
    answer = client.post(f"/jobs/{job_id}/exports/model/register", params={"name": "round two"})  # by the admin
    assert answer.status_code == 201, answer.text
    model = answer.json()
    assert (model["owner"], model["source_job_id"], model["name"], model["files"]) == ("alice", job_id, "round two", 3)
    assert alice.get(f"/models/{model['id']}").json() == model
    registered = settings.registry_dir / "models" / model["id"]
    assert sorted(p.name for p in registered.iterdir()) == sorted(model_files())
    assert alice.post("/jobs", json=job_spec(model["id"])).status_code == 201
    assert audit_actions(sessions, "model.") == [("model.create", "tester", model["id"])]


def test_registering_an_export_needs_a_visible_job_with_a_model_export(
    client: TestClient, alice: TestClient, settings: Settings, sessions: sessionmaker[Session]
) -> None:
    theirs = _succeeded_job_with_export(sessions, settings, "tester")
    bare = insert_job(sessions, status="succeeded", owner="alice")
    pickled = _succeeded_job_with_export(
        sessions, settings, "alice", {**model_files(), "model.safetensors": b"x", "training_args.bin": b"x"}
    )
    assert alice.post(f"/jobs/{theirs}/exports/model/register").status_code == 404
    assert alice.post(f"/jobs/{bare}/exports/model/register").json() == {
        "detail": f"job {bare} has no model export",
        "job_id": bare,
    }
    refused = alice.post(f"/jobs/{pickled}/exports/model/register")
    assert refused.status_code == 409 and "pickle" in refused.json()["detail"]
    assert registry_counts(sessions) == (0, 0) and stored_files(settings.registry_dir) == []
