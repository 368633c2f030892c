"""uvicorn's HTTP/1.1 protocol (httptools) with the writes of one event-loop step sent as one.

uvicorn writes a response's head to the socket when the app sends ``http.response.start`` and
its body when it sends ``http.response.body``: two ``send`` system calls, two TCP segments
and, on the client's side, often two wake-ups for every answer, though the app sends both
messages in the same step of the event loop. :class:`CoalescedHttpToolsProtocol` gives
uvicorn a transport that gathers the writes of a step and hands them to the socket's
transport together once the step is over (``loop.call_soon``): one segment per answer,
nothing held longer than the step that wrote it. A close sends what is gathered first; a
streamed response (``GET /jobs/{id}/events``) still goes out chunk by chunk, each as its
step ends. Everything else is the socket's transport itself (flow control included: its
buffer limits still pause the writer).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport:
    """Wraps a connection's transport: :meth:`write` gathers until the loop's next step."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.loop = loop
        self._gathered: list[bytes] = []

    def write(self, data: bytes) -> None:
        """Gather ``data``; the step's writes go to the socket together once the step is over."""
        if not data:
            return
        if not self._gathered:
            self.loop.call_soon(self.flush)
        self._gathered.append(data)

    def flush(self) -> None:
        """Hand what was gathered to the socket's transport now (nothing once it is closing)."""
        if not self._gathered:
            return
        gathered, self._gathered = self._gathered, []
        if not self.transport.is_closing():
            self.transport.write(gathered[0] if len(gathered) == 1 else b"".join(gathered))

    def close(self) -> None:
        """Send what was gathered, then close (the transport sends its buffer before it closes)."""
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
