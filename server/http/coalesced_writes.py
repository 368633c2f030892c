"""uvicorn's HTTP/1.1 protocol (httptools) with an answer's head and body sent in one write.

uvicorn writes a response's head to the socket when the app sends ``http.response.start`` and
its body when it sends ``http.response.body``: two ``send`` system calls, two TCP segments
and, on the client's side, often two wake-ups for every answer, though the app sends both
messages in the same step of the event loop. :class:`CoalescedHttpToolsProtocol` gives
uvicorn a transport that holds a write until the next one and sends the two together at
once: the body goes out with its head, no later than uvicorn would have sent it. A write
that no other follows in its step (a ``304``'s head, a ``HEAD`` answer's, a streamed chunk)
goes out as that step ends (``loop.call_soon``); a close sends what is held first.
Everything else is the socket's transport itself (flow control included: its buffer limits
still pause the writer).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport:
    """Wraps a connection's transport: :meth:`write` holds one write until the next one, or the step's end."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        """Hold ``data`` (no write held), else send the held write and ``data`` together now."""
        if not data:
            return
        held = self._held
        if held is None:
            self._held = data
            self.loop.call_soon(self.flush)
            return
        self._held = None
        if not self.transport.is_closing():
            self.transport.writelines((held, data))  # one send (uvloop: vectored, no copy)

    def flush(self) -> None:
        """Send the held write now (nothing once the socket's transport is closing)."""
        held, self._held = self._held, None
        if held is not None and not self.transport.is_closing():
            self.transport.write(held)

    def close(self) -> None:
        """Send what is held, then close (the transport sends its buffer before it closes)."""
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        """Whether the socket's transport is closing."""
        return self.transport.is_closing()

    def __getattr__(self, name: str) -> Any:  # everything else: the socket's transport's own (any of its methods)
        return getattr(self.transport, name)


class CoalescedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, writing through a :class:`CoalescingTransport` (``uvicorn.run(http=...)``)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Start the connection on the coalescing wrapper of ``transport``."""
        coalescing = CoalescingTransport(cast(asyncio.Transport, transport), self.loop)  # uvloop's: no subclass
        super().connection_made(cast(asyncio.Transport, coalescing))  # duck-typed: every method is forwarded
