"""``/datasets`` on SQLite and PostgreSQL: uploads checked row by row and stored content-addressed, owner
isolation, audit, the storage quota, size limits, deletion (409 while a job uses it), and job specs naming
a registered dataset (``dataset_id``). Every refused upload stores nothing: no row, no file."""

from __future__ import annotations

import hashlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_support import FakeQueue, make_token
from fastapi.testclient import TestClient
from registry_support import (
    CHAT_ROWS,
    audit_actions,
    jsonl,
    registry_counts,
    stored_files,
)
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db.models import Job
from halfcast.core.db.quotas import set_quota
from halfcast.core.settings import Settings
from server.app import create_app

JSONL = {"content-type": "application/jsonl"}
CSV = {"content-type": "text/csv"}
CLASSES_CSV = b'text,label\nthe cat sat,animal\n"a long, quoted\nline",plant\nthe dog ran,animal\n'


def upload(client: TestClient, body: bytes, fmt: str = "chat", headers: dict[str, str] = JSONL, **params: Any) -> Any:
    return client.post("/datasets", params={"format": fmt, **params}, content=body, headers=headers)


def hf_spec(config: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "model": {"name": "hf", "config": {"path": "tiny"}},
        "dataset": {"name": "jsonl", "config": config},
        "max_steps": 2,
        **fields,
    }


@pytest.fixture
def registry(settings: Settings) -> Path:
    return settings.registry_dir


@pytest.fixture
def alice(database_url: str, settings: Settings, fake_queue: FakeQueue) -> Iterator[TestClient]:
    """A client of the same app as a plain token of owner ``alice``."""
    token = make_token(database_url, "alice")
    with TestClient(create_app(settings, fake_queue), headers={"Authorization": f"Bearer {token}"}) as test_client:
        yield test_client


def test_an_upload_is_checked_stored_under_its_sha256_and_listed(
    client: TestClient, registry: Path, sessions: sessionmaker[Session]
) -> None:
    body = jsonl(CHAT_ROWS)
    answer = upload(client, body, name="sums")
    assert answer.status_code == 201, answer.text
    dataset = answer.json()
    digest = hashlib.sha256(body).hexdigest()
    assert {k: dataset[k] for k in ("name", "format", "file_format", "rows", "bytes", "sha256", "owner")} == {
        "name": "sums",
        "format": "chat",
        "file_format": "jsonl",
        "rows": 6,
        "bytes": len(body),
        "sha256": digest,
        "owner": "tester",
    }
    assert answer.headers["location"] == f"/datasets/{dataset['id']}"
    assert (registry / "datasets" / f"{digest}.jsonl").read_bytes() == body
    assert client.get(f"/datasets/{dataset['id']}").json() == dataset
    assert client.get("/datasets").json() == {"datasets": [dataset], "next_cursor": None}
    assert audit_actions(sessions, "dataset.") == [("dataset.create", "tester", dataset["id"])]


def test_a_csv_upload_counts_records_not_lines(client: TestClient) -> None:
    answer = upload(client, CLASSES_CSV, "classification", CSV)
    assert answer.status_code == 201, answer.text
    assert (answer.json()["rows"], answer.json()["file_format"]) == (3, "csv")


@pytest.mark.parametrize(
    ("body", "fmt", "loc", "fragment"),
    [
        (jsonl([*CHAT_ROWS[:2], {"messages": []}, *CHAT_ROWS]), "chat", ["body", "line", 3, "messages"], "empty"),
        (jsonl(CHAT_ROWS[:1]) + b'{"messages": [{"role": "user"}]}\n', "chat",
         ["body", "line", 2, "messages[0].content"], "missing"),
        (jsonl(CHAT_ROWS[:1]) + b"{not json\n", "chat", ["body", "line", 2], "invalid JSON"),
        (jsonl([{"text": "a"}, {"txt": "b"}]), "text", ["body", "line", 2, "text"], "missing"),
        (jsonl([{"instruction": "a", "output": 3}]), "instruction", ["body", "line", 1, "output"], "expected a string"),
        (b"\n\n", "text", ["body"], "holds no rows"),
        (jsonl([{"text": "a", "label": 1}, {"text": "b", "label": "x"}]), "classification", ["body", "line", 2, "label"],
         "a class name"),
        (jsonl([{"text": "a", "label": 0}, {"text": "b", "label": 0}]), "classification", ["body", "line", 1, "label"],
         "same class"),
    ],
    ids=["empty-chat", "missing-content", "bad-json", "missing-text", "number-output", "no-rows", "mixed-labels",
         "one-class"],
)  # fmt: skip  # a case table, laid out by hand
def test_a_bad_row_is_a_422_naming_its_line_and_field_and_nothing_is_stored(
    client: TestClient,
    registry: Path,
    sessions: sessionmaker[Session],
    body: bytes,
    fmt: str,
    loc: list[Any],
    fragment: str,
) -> None:
    answer = upload(client, body, fmt)
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["detail"]
    assert error["loc"] == loc and fragment in error["msg"], error
    assert registry_counts(sessions) == (0, 0) and stored_files(registry) == []
    assert audit_actions(sessions, "dataset.") == []


def test_a_bad_csv_row_is_named_by_the_line_it_starts_on(client: TestClient) -> None:
    answer = upload(client, b'text,label\n"two\nlines",a\n,b\n', "classification", CSV)
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"] == ["body", "line", 4, "text"]


@pytest.mark.parametrize(
    ("params", "headers", "status", "where"),
    [
        ({"format": "chat"}, {"content-type": "application/json"}, 415, None),
        ({"format": "chat"}, {}, 415, None),
        ({"format": "chat"}, CSV, 422, ["query", "format"]),
        ({"format": "speech"}, JSONL, 422, ["query", "format"]),
        ({}, JSONL, 422, ["query", "format"]),
        ({"format": "text", "name": "\x07bell"}, JSONL, 422, ["query", "name"]),
    ],
)  # fmt: skip  # a case table, laid out by hand
def test_bad_requests_are_refused_before_reading_the_body(
    client: TestClient,
    registry: Path,
    sessions: sessionmaker[Session],
    params: dict[str, str],
    headers: dict[str, str],
    status: int,
    where: list[str] | None,
) -> None:
    answer = client.post("/datasets", params=params, content=jsonl(CHAT_ROWS), headers=headers)
    assert answer.status_code == status, answer.text
    if where is not None:
        assert where in [error["loc"] for error in answer.json()["detail"]]
    assert registry_counts(sessions) == (0, 0) and stored_files(registry) == []


def _small_app(settings: Settings, fake_queue: FakeQueue, auth_headers: dict[str, str], **changes: Any) -> TestClient:
    return TestClient(create_app(settings.model_copy(update=changes), fake_queue), headers=auth_headers)


def test_an_upload_over_the_size_limit_is_a_413_declared_or_streamed(
    settings: Settings, fake_queue: FakeQueue, auth_headers: dict[str, str], sessions: sessionmaker[Session]
) -> None:
    body = jsonl(CHAT_ROWS)
    with _small_app(settings, fake_queue, auth_headers, max_upload_bytes=len(body) - 1) as small:
        declared = upload(small, body)
        streamed = small.post(
            "/datasets",
            params={"format": "chat"},
            headers=JSONL,
            content=(body[i : i + 100] for i in range(0, len(body), 100)),
        )
        assert upload(small, body[: len(body) // 2].rsplit(b"\n", 2)[0] + b"\n").status_code == 201
    assert (declared.status_code, streamed.status_code) == (413, 413), (declared.text, streamed.text)
    assert "HALFCAST_MAX_UPLOAD_BYTES" in streamed.json()["detail"]
    assert registry_counts(sessions) == (1, 0)
    assert [p.name for p in (settings.registry_dir / ".staging").iterdir()] == []


def test_the_storage_quota_is_a_429_naming_it(
    settings: Settings, fake_queue: FakeQueue, auth_headers: dict[str, str], sessions: sessionmaker[Session]
) -> None:
    body = jsonl(CHAT_ROWS)
    with _small_app(settings, fake_queue, auth_headers, quota_max_storage_bytes=len(body) * 2) as limited:
        assert upload(limited, body).status_code == 201
        assert upload(limited, body).status_code == 201  # the same bytes again: counted again
        refused = upload(limited, body)
        streamed = limited.post("/datasets", params={"format": "chat"}, headers=JSONL, content=iter([body]))
        with sessions() as session:
            set_quota(session, "tester", {"max_storage_bytes": len(body) * 3}, actor="cli:test")
        assert upload(limited, body).status_code == 201  # the owner's override wins
    assert (refused.status_code, streamed.status_code) == (429, 429)
    assert refused.json() == {
        "detail": f"quota exceeded: max_storage_bytes is {len(body) * 2} for owner tester ({len(body) * 2} in use)",
        "limit": "max_storage_bytes",
        "value": len(body) * 2,
    }
    assert refused.headers["retry-after"] == "30"
    assert registry_counts(sessions) == (3, 0)


def test_another_owner_gets_404s_and_an_admin_sees_all(client: TestClient, alice: TestClient) -> None:
    mine = upload(alice, jsonl(CHAT_ROWS)).json()
    theirs = upload(client, jsonl(CHAT_ROWS[:3])).json()
    assert alice.get(f"/datasets/{theirs['id']}").status_code == 404
    assert alice.delete(f"/datasets/{theirs['id']}").status_code == 404
    assert alice.get(f"/datasets/{theirs['id']}").json() == {"detail": f"dataset {theirs['id']} not found"}
    assert [d["id"] for d in alice.get("/datasets").json()["datasets"]] == [mine["id"]]
    assert {d["id"] for d in client.get("/datasets").json()["datasets"]} == {mine["id"], theirs["id"]}
    assert client.get(f"/datasets/{mine['id']}").status_code == 200
    refused = alice.post("/jobs", json=hf_spec({"dataset_id": theirs["id"]}))
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "dataset", "jsonl", "config", "dataset_id"]
    assert alice.post("/jobs", json=hf_spec({"dataset_id": mine["id"]})).status_code == 201


def test_the_list_pages_newest_first(client: TestClient) -> None:
    ids = [upload(client, jsonl(CHAT_ROWS[:n])).json()["id"] for n in (1, 2, 3)]
    first = client.get("/datasets", params={"limit": 2}).json()
    second = client.get("/datasets", params={"limit": 2, "cursor": first["next_cursor"]}).json()
    assert [d["id"] for d in first["datasets"] + second["datasets"]] == ids[::-1] and second["next_cursor"] is None
    assert client.get("/datasets", params={"cursor": "nope"}).status_code == 422


def test_a_dataset_a_job_uses_cannot_be_deleted_until_the_job_ends(
    client: TestClient, registry: Path, sessions: sessionmaker[Session]
) -> None:
    body = jsonl(CHAT_ROWS)
    first, twin = upload(client, body).json(), upload(client, body).json()
    assert first["sha256"] == twin["sha256"]
    job = client.post("/jobs", json=hf_spec({"dataset_id": first["id"]}))
    assert job.status_code == 201, job.text
    refused = client.delete(f"/datasets/{first['id']}")
    assert refused.status_code == 409 and job.json()["id"] in refused.json()["detail"]
    with sessions() as session:
        session.execute(update(Job).values(status="succeeded"))
        session.commit()
    assert client.delete(f"/datasets/{first['id']}").status_code == 204
    assert client.get(f"/datasets/{first['id']}").status_code == 404
    assert stored_files(registry) == [f"datasets/{first['sha256']}.jsonl"]  # the twin still has the bytes
    assert client.delete(f"/datasets/{twin['id']}").status_code == 204
    assert stored_files(registry) == [] and registry_counts(sessions) == (0, 0)
    assert [a for a, _, _ in audit_actions(sessions, "dataset.")] == ["dataset.create"] * 2 + ["dataset.delete"] * 2


def test_a_job_spec_names_a_registered_dataset_and_is_stored_as_sent(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    dataset = upload(client, jsonl(CHAT_ROWS)).json()
    answer = client.post("/jobs", json=hf_spec({"dataset_id": dataset["id"], "masking": "last"}))
    assert answer.status_code == 201, answer.text
    with sessions() as session:
        stored = session.scalars(select(Job.spec)).one()
    stored_dataset = stored["dataset"]
    assert isinstance(stored_dataset, dict)
    config = stored_dataset["config"]
    assert (config["dataset_id"], config["format"], config["sha256"], config["path"]) == (
        dataset["id"],
        None,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("config", "field", "fragment"),
    [
        ({"masking": "output"}, "masking", "does not apply to format 'chat'"),
        ({"format": "text"}, "format", "has format 'chat'"),
        ({"file_format": "csv"}, "file_format", "has file_format 'jsonl'"),
        ({"sha256": "0" * 64}, "sha256", "has sha256"),
        ({"column_map": {"m": "messages"}}, "column_map", "registered dataset"),
        ({"path": "d.jsonl", "format": "chat"}, "path", "exactly one of path"),
    ],
)  # fmt: skip  # a case table, laid out by hand
def test_a_spec_that_disagrees_with_its_registered_dataset_is_a_422_at_the_field(
    client: TestClient, sessions: sessionmaker[Session], config: dict[str, Any], field: str, fragment: str
) -> None:
    dataset = upload(client, jsonl(CHAT_ROWS)).json()
    answer = client.post("/jobs", json=hf_spec({"dataset_id": dataset["id"], **config}))
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["detail"]
    assert error["loc"] == ["body", "dataset", "jsonl", "config", field] and fragment in error["msg"], error
    with sessions() as session:
        assert session.scalars(select(Job)).all() == []


def test_early_stopping_on_accuracy_needs_a_classification_dataset(client: TestClient) -> None:
    chat = upload(client, jsonl(CHAT_ROWS)).json()
    classes = upload(client, CLASSES_CSV, "classification", CSV).json()
    stop = {"eval_interval": 1, "early_stopping": {"metric": "accuracy"}}
    model = {"name": "hf", "config": {"path": "tiny", "task": "sequence_classification", "num_labels": 2}}
    refused = client.post("/jobs", json={**hf_spec({"dataset_id": chat["id"]}, **stop)})
    accepted = client.post("/jobs", json={**hf_spec({"dataset_id": classes["id"]}, **stop), "model": model})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "early_stopping", "metric"]
    assert accepted.status_code == 201, accepted.text


def test_an_unknown_dataset_id_is_a_422_and_a_malformed_one_too(client: TestClient) -> None:
    for value in ("00000000-0000-4000-8000-000000000000", "../../etc/passwd"):
        answer = client.post("/jobs", json=hf_spec({"dataset_id": value}))
        assert answer.status_code == 422
        assert answer.json()["detail"][0]["loc"] == ["body", "dataset", "jsonl", "config", "dataset_id"], answer.text
    assert client.get("/datasets/nope").status_code == 404


def test_the_spec_keeps_its_json_shape(client: TestClient) -> None:
    """A registered dataset leaves the job resource's spec as it was sent (defaults spelled out)."""
    dataset = upload(client, jsonl(CHAT_ROWS)).json()
    job = client.post("/jobs", json=hf_spec({"dataset_id": dataset["id"]})).json()
    assert json.dumps(job["spec"]["dataset"]["config"]["dataset_id"]) == json.dumps(dataset["id"])


def _cut_off(url: str, path: str, headers: dict[str, str], body: bytes) -> None:
    """Send a request declaring all of ``body`` but only half of it, then close the connection."""
    host, port = url.removeprefix("http://").split(":")
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}",
        f"Content-Length: {len(body)}",
        *(f"{name}: {value}" for name, value in headers.items()),
        "",
        "",
    ]
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall("\r\n".join(lines).encode() + body[: len(body) // 2])
        time.sleep(0.3)  # the route is streaming the body to its staging file


@pytest.mark.parametrize("kind", ["dataset", "model"])
def test_an_upload_cut_off_mid_way_leaves_nothing_behind(
    settings: Settings, fake_queue: FakeQueue, auth_headers: dict[str, str], sessions: sessionmaker[Session], kind: str
) -> None:
    from live_server import LiveServer, wait_until
    from registry_support import model_tar

    if kind == "dataset":
        path, body, content_type = "/datasets?format=chat", jsonl(CHAT_ROWS * 20000), "application/jsonl"
    else:
        path, body, content_type = "/models", model_tar(), "application/x-tar"
        body += b"\0" * (4 << 20)
    staging = settings.registry_dir / ".staging"
    with LiveServer(create_app(settings, fake_queue)) as server:
        _cut_off(server.url, path, {**auth_headers, "Content-Type": content_type}, body)
        assert wait_until(lambda: staging.is_dir() and not any(staging.iterdir()), timeout_s=10), list(
            staging.iterdir()
        )
        assert httpx.get(f"{server.url}/datasets", headers=auth_headers).status_code == 200  # still serving
    assert registry_counts(sessions) == (0, 0) and stored_files(settings.registry_dir) == []


def test_a_line_over_the_line_limit_is_refused_without_reading_it_whole(
    client: TestClient, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    import server.registry.dataset_check as dataset_check

    monkeypatch.setattr(dataset_check, "MAX_LINE_BYTES", 100)
    answer = upload(client, b'{"text": "short"}\n{"text": "' + b"x" * 200 + b'"}\n', "text")
    assert answer.status_code == 422
    [error] = answer.json()["detail"]
    assert error["loc"] == ["body", "line", 2] and "longer than 100 bytes" in error["msg"], error
    assert registry_counts(sessions) == (0, 0)
