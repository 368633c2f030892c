"""ASGI middleware rejecting request bodies larger than a limit with 413 (before the app reads them)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from halfcast.contracts.limits import MAX_BODY_BYTES

if TYPE_CHECKING:  # annotations only
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["MAX_BODY_BYTES", "BodySizeLimitMiddleware"]


class BodySizeLimitMiddleware:
    """Answers 413 ``{"detail": ...}`` for a body over ``max_bytes``.

    A declared ``Content-Length`` is checked first; otherwise the body is read (up to
    the limit) and replayed to the app, so chunked uploads cannot bypass the limit. A
    request with neither ``Content-Length`` nor ``Transfer-Encoding`` has no body (RFC 9112
    §6.3): it is passed on as it is, without the read and replay (a poll's ``GET``).

    ``streamed`` names the upload routes, ``(method, path)``, with their own limit: their
    bodies are not read here but passed on as they arrive (the route streams them to disk
    and enforces the limit as it reads: :mod:`server.registry.upload`); only a declared
    ``Content-Length`` over their limit is refused here.
    """

    def __init__(
        self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES, streamed: Mapping[tuple[str, str], int] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.streamed = dict(streamed or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, or answer 413."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared, framed = self._framing(scope)
        if not framed:  # no body (RFC 9112 §6.3): nothing to limit
            await self.app(scope, receive, send)
            return
        upload_limit = self.streamed.get((scope.get("method", ""), scope.get("path", "")))
        if upload_limit is not None:
            if declared is not None and declared > upload_limit:
                await self._reject(send, upload_limit)
                return
            await self.app(scope, receive, send)
            return
        if declared is not None and declared > self.max_bytes:
            await self._reject(send, self.max_bytes)
            return
        messages = await self._read_body(receive)
        if messages is None:
            await self._reject(send, self.max_bytes)
            return
        await self.app(scope, self._replay(messages, receive), send)

    @staticmethod
    def _framing(scope: Scope) -> tuple[int | None, bool]:
        """The declared ``Content-Length`` (``None``: none, or not a number) and whether there is a ``Transfer-Encoding``.

        A ``Content-Length`` that is not a number counts as a body of unknown length (read up to the limit).
        """
        declared: int | None = None
        framed = False
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                framed = True
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
            elif name == b"transfer-encoding":
                framed = True
        return declared, framed

    async def _read_body(self, receive: Receive) -> list[Message] | None:
        """All body messages, or ``None`` once they exceed the limit."""
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                return None
            if not message.get("more_body", False):
                return messages

    @staticmethod
    def _replay(messages: list[Message], receive: Receive) -> Receive:
        pending = list(messages)

        async def replayed() -> Message:
            return pending.pop(0) if pending else await receive()

        return replayed

    @staticmethod
    async def _reject(send: Send, limit: int) -> None:
        body = json.dumps({"detail": f"request body exceeds {limit} bytes"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
