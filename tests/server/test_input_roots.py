"""Issue 25 item 11: a model or data path no registered worker's roots can hold is a 422 at its field.

Before, such a job was accepted (201) and then failed ``model_unavailable: no model roots are
configured``. Workers report their roots with their heartbeat; roots this host cannot see are not
judged, and without a worker that reports roots nothing is refused (the job waits).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from api_support import FakeQueue, count_rows
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db.models import Worker, utcnow

HF_TEXT = {"model": {"name": "hf", "config": {"path": "llama"}}, "dataset": {"name": "text"}, "max_steps": 2}
JSONL = {
    "model": {"name": "hf", "config": {"path": "llama"}},
    "dataset": {"name": "jsonl", "config": {"path": "chat.jsonl", "format": "chat"}},
    "max_steps": 2,
}
MODEL_PATH, DATA_PATH = ["body", "model", "config", "path"], ["body", "dataset", "config", "path"]


def _worker(sessions: sessionmaker[Session], name: str, models: list[str] | None, data: list[str] | None) -> None:
    now = utcnow()
    with sessions() as session:
        session.add(
            Worker(
                id=f"{name}/1",
                hostname=name,
                pid=1,
                gpus=[],
                concurrency=1,
                started_at=now - timedelta(minutes=5),
                heartbeat_at=now,
                model_roots=models,
                data_roots=data,
            )
        )
        session.commit()


def _errors(client: TestClient, spec: dict[str, Any]) -> list[tuple[list[str], str]]:
    response = client.post("/jobs", json=spec)
    if response.status_code == 201:
        return []
    assert response.status_code == 422, response.text
    return [(item["loc"], item["msg"]) for item in response.json()["detail"]]


def test_no_worker_with_model_roots_refuses_a_model_path_at_its_field(
    client: TestClient, sessions: sessionmaker[Session], fake_queue: FakeQueue
) -> None:
    _worker(sessions, "bare", [], [])
    [(loc, msg)] = _errors(client, HF_TEXT)
    assert loc == MODEL_PATH and msg.startswith("no worker has model roots configured (HALFCAST_MODEL_ROOTS)")
    assert count_rows(sessions) == 0 and fake_queue.sent == []  # nothing stored or sent


def test_a_path_under_none_of_the_visible_roots_is_refused_and_one_under_a_root_is_accepted(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    models, data = tmp_path / "models", tmp_path / "data"
    models.mkdir()
    data.mkdir()
    _worker(sessions, "host", [str(models)], [str(data)])
    assert _errors(client, JSONL) == [
        (MODEL_PATH, "'llama' is under none of the workers' model roots (HALFCAST_MODEL_ROOTS)"),
        (DATA_PATH, "'chat.jsonl' is under none of the workers' data roots (HALFCAST_DATA_ROOTS)"),
    ]
    (models / "llama").mkdir()
    (data / "chat.jsonl").write_text("{}\n")
    assert _errors(client, JSONL) == []


@pytest.mark.parametrize(
    ("models", "data"),
    [(["/nonexistent/halfcast-model-root"], ["/nonexistent/halfcast-data-root"]), (None, None)],
    ids=["roots-on-another-host", "worker-that-reports-no-roots"],
)
def test_what_this_host_cannot_judge_is_accepted(
    client: TestClient, sessions: sessionmaker[Session], models: list[str] | None, data: list[str] | None
) -> None:
    _worker(sessions, "remote", models, data)
    assert _errors(client, JSONL) == []


def test_without_a_registered_worker_the_job_waits(client: TestClient) -> None:
    assert _errors(client, JSONL) == []


def test_one_worker_that_can_read_it_is_enough(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    (tmp_path / "llama").mkdir()
    _worker(sessions, "bare", [], [])
    _worker(sessions, "able", [str(tmp_path)], [])
    assert _errors(client, HF_TEXT) == []


FORMAT = ["body", "dataset", "config", "format"]


@pytest.mark.parametrize(
    ("files", "refused"),
    [
        ({"tokenizer_config.json": '{"model_max_length": 512}'}, True),  # an encoder's tokenizer: no template
        ({"tokenizer_config.json": '{"chat_template": ""}'}, True),
        ({"tokenizer_config.json": '{"chat_template": "{{ messages }}"}'}, False),
        ({"tokenizer_config.json": "{}", "chat_template.jinja": "{{ messages }}"}, False),
        ({"config.json": "{}"}, False),  # no tokenizer config: another failure, the trainer's
        ({"tokenizer_config.json": "{not json"}, False),  # unreadable: not judged
    ],
    ids=["encoder", "empty-template", "template", "template-file", "no-tokenizer-config", "unreadable"],
)
def test_a_chat_dataset_on_a_tokenizer_without_a_chat_template_is_refused_at_its_format(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path, files: dict[str, str], refused: bool
) -> None:
    """Issue 25 item 12: it was accepted, then failed spec_invalid at run time."""
    models, data = tmp_path / "models", tmp_path / "data"
    (models / "llama").mkdir(parents=True)
    data.mkdir()
    (data / "chat.jsonl").write_text("{}\n")
    for name, text in files.items():
        (models / "llama" / name).write_text(text)
    _worker(sessions, "host", [str(models)], [str(data)])
    errors = _errors(client, JSONL)
    if refused:
        [(loc, msg)] = errors
        assert loc == FORMAT and msg.startswith("format 'chat' needs a tokenizer with a chat template, and 'llama'")
    else:
        assert errors == []
