"""A minimal keep-alive HTTP/1.1 client for the API load bench's pollers (asyncio streams).

On a small machine the load generator shares the cores with the API it measures:
httpx spends about 1.7 ms of CPU per request, which at a few hundred requests per
second takes most of a core and adds its own queueing to every latency. This client
does only what a poller needs (``GET`` with headers on one kept-alive connection,
a ``Content-Length`` body read and dropped) for about a tenth of that. It reconnects
after a transport error, a timeout or ``Connection: close``.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

#: Longest response head accepted (status line and headers).
MAX_HEAD_BYTES = 64 * 1024


class RawHttpConnection:
    """One connection to ``url``'s host, sending ``GET`` requests with ``headers`` on every one."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.fixed = "".join(f"{name}: {value}\r\n" for name, value in {"Host": parts.netloc, **headers}.items())
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
        """``(status, lower-cased response headers)`` of ``GET path``; raises ``OSError``/``asyncio.IncompleteReadError``."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=MAX_HEAD_BYTES)
        extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        self._writer.write(f"GET {path} HTTP/1.1\r\n{self.fixed}{extra}\r\n".encode())
        try:
            status, response_headers = await self._read_response()
        except BaseException:
            self.close()
            raise
        if response_headers.get("connection", "").lower() == "close":
            self.close()
        return status, response_headers

    async def _read_response(self) -> tuple[int, dict[str, str]]:
        assert self._reader is not None
        head = (await self._reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        status_line, *lines = head.split("\r\n")
        headers = {}
        for line in lines:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        if length:
            await self._reader.readexactly(length)
        return int(status_line.split(" ", 2)[1]), headers

    def close(self) -> None:
        """Drop the connection (the next request opens a new one)."""
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
