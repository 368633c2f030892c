"""``halfcast up`` announces the API's URL and the ``export HALFCAST_URL=...`` line once ``/readyz`` answers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from server.cli.ready import announce_when_ready, client_url, ready_message, wait_until_ready


@pytest.mark.parametrize(
    ("host", "port", "url"),
    [("127.0.0.1", 8123, "http://127.0.0.1:8123"), ("0.0.0.0", 8000, "http://127.0.0.1:8000"),
     ("::", 9000, "http://[::1]:9000"), ("::1", 9001, "http://[::1]:9001"), ("localhost", 8124, "http://localhost:8124"),
     ("10.1.2.3", 8125, "http://10.1.2.3:8125")],
)  # fmt: skip  # a case table, laid out by hand
def test_client_url_is_where_a_local_client_reaches_the_api(host: str, port: int, url: str) -> None:
    assert client_url(host, port) == url


def test_the_message_gives_the_url_and_the_line_to_export() -> None:
    lines = ready_message("http://127.0.0.1:8123", Path("/srv/hc")).splitlines()
    assert "http://127.0.0.1:8123" in lines[0] and "/srv/hc" in lines[0]
    assert lines[1].strip() == "export HALFCAST_URL=http://127.0.0.1:8123"


class CountingServer(ThreadingHTTPServer):
    """Counts the requests it has had; :class:`ReadyAfter` answers 503 to the first ``not_ready`` of them."""

    requests = 0
    not_ready = 0


class ReadyAfter(BaseHTTPRequestHandler):
    """``/readyz`` answers 503 to the first ``server.not_ready`` requests, then 200."""

    def do_GET(self) -> None:  # http.server calls it by this name
        server = self.server
        assert isinstance(server, CountingServer)
        server.requests += 1
        ready = self.path == "/readyz" and server.requests > server.not_ready
        self.send_response(200 if ready else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[CountingServer]:
    """A stand-in API on a free loopback port, ready from its third request on."""
    server = CountingServer(("127.0.0.1", 0), ReadyAfter)
    server.requests, server.not_ready = 0, 2
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def url_of(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    assert isinstance(host, str)
    return client_url(host, port)


def test_waits_through_not_ready_answers(api: CountingServer) -> None:
    assert wait_until_ready(url_of(api), threading.Event(), wait_s=10)
    assert api.requests == 3


def test_gives_up_on_an_api_that_never_listens() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert not wait_until_ready(f"http://127.0.0.1:{port}", threading.Event(), wait_s=0.5)


def test_stops_waiting_when_up_stops() -> None:
    stop = threading.Event()
    stop.set()
    assert not wait_until_ready("http://127.0.0.1:9", stop, wait_s=60)


def test_announces_once_ready(api: ThreadingHTTPServer, capsys: pytest.CaptureFixture[str]) -> None:
    announce_when_ready(url_of(api), Path("/srv/hc"), threading.Event(), wait_s=10).join(timeout=10)
    assert capsys.readouterr().out == ready_message(url_of(api), Path("/srv/hc"))


def test_says_nothing_on_stdout_when_never_ready(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    announce_when_ready("http://127.0.0.1:9", Path("/srv/hc"), threading.Event(), wait_s=0.3).join(timeout=10)
    assert capsys.readouterr().out == ""
    assert "was not ready within" in caplog.text
