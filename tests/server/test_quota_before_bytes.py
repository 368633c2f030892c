"""Issue 24 item 4: the storage quota is checked before the bytes: an upload by an owner at quota reads nothing,
one that crosses the quota stops reading there, and a model archive is never extracted past it.

Before: a model upload by an owner already at quota wrote the archive and its extracted copy to staging
(6.3 MB in the attack) before its 429. Runs on SQLite and PostgreSQL (``database_url``).
"""

from __future__ import annotations

import contextlib
import socket
import tarfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from api_support import FakeQueue
from fastapi.testclient import TestClient
from live_server import LiveServer
from registry_support import model_files, model_tar, registry_counts, stored_files
from sqlalchemy.orm import Session, sessionmaker
from starlette.requests import Request

from halfcast.core.settings import Settings
from server.app import create_app
from server.registry.model_archive import TAR_OVERHEAD_BYTES

TAR = {"content-type": "application/x-tar"}
JSONL = {"content-type": "application/jsonl"}
CHUNK = 64 << 10
ROW = b'{"text": "' + b"x" * 1000 + b'"}\n'


class CountedBody:
    """A streamed request body (no ``Content-Length``), in chunks."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __iter__(self) -> Iterator[bytes]:
        for start in range(0, len(self.data), CHUNK):
            yield self.data[start : start + CHUNK]


@pytest.fixture
def app_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes each request's handler pulled from its body stream (a spy on Starlette's ``Request.stream``).

    The test client hands the app the whole body at once, so the count is the bytes the app
    took in, rounded up to the one message it got: what matters is whether it read at all and
    whether it kept reading after the quota was crossed.
    """
    pulled: list[int] = []
    original = Request.stream

    async def counted(self: Request) -> AsyncIterator[bytes]:
        pulled.append(0)
        async for chunk in original(self):
            pulled[-1] += len(chunk)
            yield chunk

    monkeypatch.setattr(Request, "stream", counted)
    return pulled


@pytest.fixture
def limited(settings: Settings, fake_queue: FakeQueue, auth_headers: dict[str, str]) -> Iterator[TestClient]:
    """A client of an app whose owners may store 200 kB."""
    app = create_app(settings.model_copy(update={"quota_max_storage_bytes": 200_000}), fake_queue)
    with TestClient(app, headers=auth_headers) as client:
        yield client


def _fill_quota(client: TestClient) -> None:
    """Store datasets until the owner is exactly at its 200 kB quota."""
    rows = 200_000 // len(ROW)
    body = ROW * rows + b'{"text": "' + b"y" * (200_000 - rows * len(ROW) - 13) + b'"}\n'
    assert len(body) == 200_000
    answer = client.post("/datasets", params={"format": "text"}, content=body, headers=JSONL)
    assert answer.status_code == 201, answer.text


@pytest.mark.parametrize("route", ["/models", "/datasets"])
def test_an_owner_at_quota_is_refused_before_a_byte_is_read(
    limited: TestClient, settings: Settings, sessions: sessionmaker[Session], app_read: list[int], route: str
) -> None:
    _fill_quota(limited)
    app_read.clear()
    body = CountedBody(model_tar(model_files(None, **{"big.safetensors": b"\0" * 3_000_000})))
    params: dict[str, Any] = {"format": "text"} if route == "/datasets" else {}
    answer = limited.post(route, params=params, content=body, headers=TAR if route == "/models" else JSONL)
    assert answer.status_code == 429, answer.text
    assert answer.json()["limit"] == "max_storage_bytes"
    assert app_read == [], app_read  # the body was never opened
    assert registry_counts(sessions) == (1, 0) and not list((settings.registry_dir / ".staging").iterdir())


def _answer_while_sending(url: str, token: str, path: str, content_type: str, sent_first: int) -> bytes:
    """POST a chunked body of which only ``sent_first`` bytes are sent; the status line the server answers meanwhile.

    A server that stops reading where the quota is crossed answers while the client still
    holds the rest; one that reads to the end never answers (``b""`` after 20 s).
    """
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        sock.sendall(head.encode())
        block = b"\0" * CHUNK
        with contextlib.suppress(OSError):  # the server may close once it has answered
            for _ in range(sent_first // CHUNK + 1):
                sock.sendall(f"{len(block):x}\r\n".encode() + block + b"\r\n")
        try:
            return sock.recv(64).split(b"\r\n", 1)[0]
        except TimeoutError:
            return b""


@pytest.mark.parametrize(
    ("path", "content_type", "sent_first"),
    [
        ("/datasets?format=text", "application/jsonl", 400_000),
        ("/models", "application/x-tar", 200_000 + TAR_OVERHEAD_BYTES + 200_000),
    ],
)
def test_an_upload_stops_being_read_where_it_crosses_the_quota(
    settings: Settings,
    fake_queue: FakeQueue,
    admin_token: str,
    sessions: sessionmaker[Session],
    path: str,
    content_type: str,
    sent_first: int,
) -> None:
    app = create_app(settings.model_copy(update={"quota_max_storage_bytes": 200_000}), fake_queue)
    with LiveServer(app) as server:
        status = _answer_while_sending(server.url, admin_token, path, content_type, sent_first)
    assert status.startswith(b"HTTP/1.1 429"), status
    assert registry_counts(sessions) == (0, 0) and not list((settings.registry_dir / ".staging").iterdir())


def test_a_model_archive_is_never_read_or_extracted_past_the_quota(
    limited: TestClient, settings: Settings, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    extracted: list[str] = []
    original = tarfile.TarFile.extractall

    def spy(self: tarfile.TarFile, *args: Any, **kwargs: Any) -> None:
        extracted.append(str(self.name))
        original(self, *args, **kwargs)

    monkeypatch.setattr(tarfile.TarFile, "extractall", spy)
    # files of 250 kB in a small archive: read in full (within the tar allowance), refused before extraction
    over = limited.post(
        "/models", content=CountedBody(model_tar(model_files(None, **{"w2.safetensors": b"\0" * 250_000}))), headers=TAR
    )
    assert over.status_code == 429, over.text
    assert extracted == []
    assert registry_counts(sessions) == (0, 0)
    assert stored_files(settings.registry_dir) == []
    assert limited.post("/models", content=model_tar(), headers=TAR).status_code == 201  # what fits is stored
