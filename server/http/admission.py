"""Admission control: each API process works on a bounded number of requests; the rest wait in a bounded line.

Without it a burst of clients fills Starlette's thread pool and the database pool
until every request, a cancel or a probe included, waits behind all the others and
times out. :class:`AdmissionMiddleware` lets at most ``max_active`` requests into the
app at once; later ones wait, first come first served, in a line of at most
``max_waiting``, each for at most ``timeout_s`` seconds. A request that finds the line
full, or waits too long, is answered at once with ``503 {"detail"}`` and
``Retry-After`` instead of hanging. A request leaves its place when its response
starts (a stream does not hold one while it streams).

Exempt, so they get through under any load: the probes (``/healthz``, ``/readyz``)
and cancels (``POST /jobs/{id}/cancel``). Uploads (``POST /datasets``, ``POST /models``) are
exempt too: a body may stream for minutes, and slow ones took every place; they pass the upload
gate instead (:mod:`server.registry.upload_gate`: per process, per owner, a minimum rate). :class:`AdmissionCollector` exports
``halfcast_api_requests_active``, ``halfcast_api_requests_waiting`` and
``halfcast_api_requests_shed_total{reason}`` (per API process).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import anyio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.http.errors import BUSY_RETRY_AFTER_S

log = logging.getLogger(__name__)

#: Paths that are never held back, whatever the method.
EXEMPT_PATHS = frozenset({"/healthz", "/readyz"})
#: ``POST`` paths that are never held back: a cancel must get through an overload; uploads have their own gate.
EXEMPT_POST = re.compile(r"^(/jobs/[^/]+/cancel|/datasets|/models)$")


class Shed(Exception):
    """A request refused admission; ``reason`` is ``queue_full`` or ``timeout``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass
class _Waiter:
    event: anyio.Event = field(default_factory=anyio.Event)
    granted: bool = False


class Limiter:
    """At most ``max_active`` holders; up to ``max_waiting`` others wait (FIFO) at most ``timeout_s`` each.

    Lives on one event loop; not thread-safe. ``shed`` counts refusals by reason.
    """

    def __init__(self, max_active: int, max_waiting: int, timeout_s: float) -> None:
        self.max_active = max_active
        self.max_waiting = max_waiting
        self.timeout_s = timeout_s
        self.active = 0
        self.shed: Counter[str] = Counter()
        self._waiters: deque[_Waiter] = deque()

    @property
    def waiting(self) -> int:
        """Requests waiting for a place now."""
        return len(self._waiters)

    async def acquire(self) -> None:
        """Take a place, waiting if need be. Raises :class:`Shed` when the line is full or the wait too long."""
        if self.active < self.max_active and not self._waiters:
            self.active += 1
            return
        if len(self._waiters) >= self.max_waiting:
            raise self._refuse(
                "queue_full", f"{len(self._waiters)} requests are already waiting (HALFCAST_API_MAX_QUEUE)"
            )
        waiter = _Waiter()
        self._waiters.append(waiter)
        try:
            with anyio.move_on_after(self.timeout_s):
                await waiter.event.wait()
        except BaseException:  # cancelled while waiting (the client went away)
            self._abandon(waiter)
            raise
        if not waiter.granted:
            self._abandon(waiter)
            raise self._refuse(
                "timeout", f"no place came free within {self.timeout_s:g} s (HALFCAST_API_QUEUE_TIMEOUT_S)"
            )

    def release(self) -> None:
        """Give the place back: to the first waiter, else free it."""
        if self._waiters:
            waiter = self._waiters.popleft()
            waiter.granted = True  # the place passes on; ``active`` stays
            waiter.event.set()
            return
        self.active -= 1

    def _abandon(self, waiter: _Waiter) -> None:
        """A waiter gives up: out of the line, or, if it was handed a place meanwhile, the place back."""
        if waiter.granted:
            self.release()
        else:
            self._waiters.remove(waiter)

    def _refuse(self, reason: str, why: str) -> Shed:
        self.shed[reason] += 1
        return Shed(reason, f"server busy: {why}; retry later")


def exempt(scope: Scope) -> bool:
    """Whether the request of ``scope`` bypasses admission (probes, cancels)."""
    path = scope.get("path", "")
    return path in EXEMPT_PATHS or (scope.get("method") == "POST" and EXEMPT_POST.match(path) is not None)


class AdmissionMiddleware:
    """Holds each HTTP request (but :func:`exempt` ones) to a place of ``limiter`` until its response starts."""

    def __init__(self, app: ASGIApp, limiter: Limiter) -> None:
        self.app = app
        self.limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Admit the request, or answer 503."""
        if scope["type"] != "http" or exempt(scope):
            await self.app(scope, receive, send)
            return
        try:
            await self.limiter.acquire()
        except Shed as exc:
            log.warning("shed %s %s: %s", scope.get("method"), scope.get("path"), exc)
            await _busy(send, str(exc))
            return
        held = True

        def leave() -> None:
            nonlocal held
            if held:
                held = False
                self.limiter.release()

        async def send_and_leave(message: Message) -> None:
            if message["type"] == "http.response.start":
                leave()
            await send(message)

        try:
            await self.app(scope, receive, send_and_leave)
        finally:
            leave()


async def _busy(send: Send, detail: str) -> None:
    """A ``503 {"detail"}`` with ``Retry-After``."""
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(BUSY_RETRY_AFTER_S).encode()),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class AdmissionCollector:
    """Prometheus collector of a :class:`Limiter`: places taken, requests waiting, requests shed by reason."""

    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter

    def collect(self) -> Iterator[Metric]:
        """The two gauges and the counter."""
        yield GaugeMetricFamily(
            "halfcast_api_requests_active", "Requests this API process works on", value=self.limiter.active
        )
        yield GaugeMetricFamily(
            "halfcast_api_requests_waiting", "Requests waiting for admission", value=self.limiter.waiting
        )
        shed = CounterMetricFamily(
            "halfcast_api_requests_shed", "Requests answered 503 by admission control", labels=["reason"]
        )
        for reason in ("queue_full", "timeout"):
            shed.add_metric([reason], self.limiter.shed[reason])
        yield shed
