"""server/http/coalesced_writes.py: an answer's head and body reach the socket in one write, nothing is held past its step.

On a recording transport (the writes the socket gets), then through a real uvicorn server on a
socket: keep-alive answers, a streamed answer and a ``Connection: close`` answer come whole.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from server.http.coalesced_writes import CoalescedHttpToolsProtocol, CoalescingTransport


class _Recording(asyncio.Transport):
    """The socket's side: what it was asked to write, write by write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 5)}.get(name, default)


def test_a_head_and_its_body_go_out_as_one_write_at_once() -> None:
    async def scenario() -> list[list[bytes]]:
        socket_side = _Recording()
        transport = CoalescingTransport(socket_side, asyncio.get_running_loop())
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        seen = [list(socket_side.writes)]  # held: its body may follow in this step
        transport.write(b"body")
        seen.append(list(socket_side.writes))  # both, in one write, before the step ends
        transport.write(b"HTTP/1.1 304 Not Modified\r\n\r\n")  # no body follows
        seen.append(list(socket_side.writes))
        await asyncio.sleep(0)
        seen.append(list(socket_side.writes))  # sent as its step ended
        return seen

    head, body, not_modified = b"HTTP/1.1 200 OK\r\n\r\n", b"body", b"HTTP/1.1 304 Not Modified\r\n\r\n"
    assert asyncio.run(scenario()) == [[], [head + body], [head + body], [head + body, not_modified]]


def test_a_close_sends_what_was_gathered_first_and_a_closed_socket_gets_nothing() -> None:
    async def scenario() -> tuple[list[bytes], bool, list[bytes]]:
        socket_side = _Recording()
        transport = CoalescingTransport(socket_side, asyncio.get_running_loop())
        transport.write(b"last words")
        transport.close()
        sent, closed = list(socket_side.writes), transport.is_closing()
        transport.write(b"after the close")
        await asyncio.sleep(0)
        return sent, closed, socket_side.writes

    assert asyncio.run(scenario()) == ([b"last words"], True, [b"last words"])


def test_everything_else_is_the_socket_transports_own() -> None:
    async def scenario() -> object:
        return CoalescingTransport(_Recording(), asyncio.get_running_loop()).get_extra_info("peername")

    assert asyncio.run(scenario()) == ("127.0.0.1", 5)


async def _numbers() -> AsyncIterator[bytes]:
    for number in range(3):
        yield f"{number}\n".encode()
        await asyncio.sleep(0.01)


def _app() -> Starlette:
    async def hello(request: Request) -> Response:
        return PlainTextResponse("hello " * 1000)

    async def stream(request: Request) -> Response:
        return StreamingResponse(_numbers(), media_type="text/plain")

    return Starlette(routes=[Route("/hello", hello), Route("/stream", stream)])


@pytest.fixture
def server_port() -> Iterator[int]:
    """A real uvicorn server with the coalescing protocol, on a free loopback port, in a thread."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    config = uvicorn.Config(_app(), host="127.0.0.1", port=port, http=CoalescedHttpToolsProtocol, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    yield port
    server.should_exit = True
    thread.join(10)


def _answer(conn: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP/1.1 answer's head and body (``Content-Length`` or chunked) read off ``conn``."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        while not body.endswith(b"0\r\n\r\n"):
            body += conn.recv(65536)
        return head, body
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += conn.recv(65536)
    return head, body


def test_a_real_server_answers_whole_answers_kept_alive_streamed_and_closed(server_port: int) -> None:
    with socket.create_connection(("127.0.0.1", server_port), timeout=10) as conn:
        for _ in range(3):  # kept alive: one answer after another on the connection
            conn.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
            head, body = _answer(conn)
            assert head.startswith(b"HTTP/1.1 200") and body == b"hello " * 1000
        conn.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body = _answer(conn)
        assert body == b"2\r\n0\n\r\n2\r\n1\n\r\n2\r\n2\n\r\n0\r\n\r\n"
        conn.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head, body = _answer(conn)
        assert body == b"hello " * 1000 and b"connection: close" in head.lower()
        assert conn.recv(10) == b""  # closed by the server once its answer was sent
