"""BodySizeLimitMiddleware on its own: the declared length is checked before any body is read."""

from __future__ import annotations

import asyncio

from starlette.types import Message, Receive, Scope, Send

from server.http.body_limit import BodySizeLimitMiddleware


async def never_called_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("the app must not see an oversized request")


async def must_not_read() -> Message:
    raise AssertionError("the body must not be read when Content-Length is already too large")


def test_declared_length_over_the_limit_is_rejected_unread() -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {"type": "http", "method": "POST", "path": "/jobs", "headers": [(b"content-length", b"2000")]}
    asyncio.run(BodySizeLimitMiddleware(never_called_app, max_bytes=1000)(scope, must_not_read, send))

    assert sent[0]["status"] == 413
    assert b"exceeds 1000 bytes" in sent[1]["body"]


def test_body_within_the_limit_is_replayed_to_the_app() -> None:
    chunks: list[Message] = [
        {"type": "http.request", "body": b"a" * 600, "more_body": True},
        {"type": "http.request", "body": b"b" * 400, "more_body": False},
    ]
    seen: list[bytes] = []

    async def receive() -> Message:
        return chunks.pop(0)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            seen.append(message["body"])
            if not message["more_body"]:
                return

    async def send(message: Message) -> None:
        raise AssertionError("nothing should be sent by the middleware")

    scope: Scope = {"type": "http", "method": "POST", "path": "/jobs", "headers": [(b"transfer-encoding", b"chunked")]}
    asyncio.run(BodySizeLimitMiddleware(app, max_bytes=1000)(scope, receive, send))

    assert b"".join(seen) == b"a" * 600 + b"b" * 400


def test_a_request_without_content_length_or_transfer_encoding_goes_on_unread() -> None:
    received: list[Receive] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        received.append(receive)

    async def send(message: Message) -> None:
        raise AssertionError("nothing should be sent by the middleware")

    scope: Scope = {"type": "http", "method": "GET", "path": "/jobs/j1", "headers": [(b"host", b"x")]}
    asyncio.run(BodySizeLimitMiddleware(app, max_bytes=1000)(scope, must_not_read, send))

    assert received == [must_not_read]  # the server's own receive: no body read, none replayed
