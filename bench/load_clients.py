"""The API load bench's clients: pollers of ``GET /jobs/{id}`` and a probe of other calls, with their statistics.

Each poller has its own kept-alive connection, as separate dashboards would (a
:class:`bench.load_http.RawHttpConnection`, or with ``client="httpx"`` an
``httpx.AsyncClient`` each), and loops ``GET /jobs/{id}`` on its job until the
deadline, pausing ``think_s`` between requests (0: back to back; each poller starts at
a random point of its first pause, so they do not all fire at once). After a ``503`` it
waits the answer's ``Retry-After``, as a well-behaved client does. With
``conditional`` it sends the last ``ETag`` it got as ``If-None-Match`` and counts a
``304`` as an answer. Every request ends in one outcome: ``ok`` (200),
``not_modified`` (304), ``timeout`` (no answer within the client timeout), ``503``, or
``other`` (any other status or transport error). :func:`poll_share` runs a share of
the pollers in one process (the bench spreads them over ``--procs`` processes);
:func:`probe` meanwhile submits and cancels a job and asks ``/healthz`` every
``interval_s``, timing each.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvloop

from bench.load_http import RawHttpConnection

#: Outcomes that are answers (the rest are errors).
ANSWERS = ("ok", "not_modified")


@dataclass(frozen=True)
class PollPlan:
    """One process's share of the pollers: the job each polls, and how."""

    url: str
    token: str
    job_ids: Sequence[str]
    duration_s: float
    warmup_s: float
    think_s: float
    conditional: bool
    timeout_s: float
    client: str = "raw"


@dataclass
class Tally:
    """Latencies (seconds) of the requests that started after the warm-up, and their outcomes."""

    latencies: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)

    def add(self, latency: float, outcome: str) -> None:
        """Count one request."""
        self.latencies.append(latency)
        self.outcomes[outcome] += 1

    def merge(self, other: Tally) -> None:
        """Add ``other``'s requests to this one."""
        self.latencies += other.latencies
        self.outcomes.update(other.outcomes)


def outcome_of(status: int, expected: int = 200) -> str:
    """The outcome of an answer with ``status`` to a request that should get ``expected``."""
    if status == expected:
        return "ok"
    return {304: "not_modified", 503: "503"}.get(status, "other")


async def timed(
    client: httpx.AsyncClient, method: str, path: str, *, expected: int = 200, **kwargs: Any
) -> tuple[float, str, httpx.Response | None]:
    """``(seconds, outcome, response)`` of one request (``response`` is ``None`` when none came)."""
    started = time.perf_counter()
    try:
        response = await client.request(method, path, **kwargs)
    except httpx.TimeoutException:
        return time.perf_counter() - started, "timeout", None
    except httpx.HTTPError:
        return time.perf_counter() - started, "other", None
    return time.perf_counter() - started, outcome_of(response.status_code, expected), response


#: One poll: ``(connection, path, headers, timeout_s) -> (seconds, outcome, response headers)``.
Getter = Callable[[Any, str, "dict[str, str] | None", float], Awaitable[tuple[float, str, dict[str, str]]]]


async def _raw_get(
    connection: RawHttpConnection, path: str, headers: dict[str, str] | None, timeout_s: float
) -> tuple[float, str, dict[str, str]]:
    """``(seconds, outcome, response headers)`` of one ``GET`` on ``connection`` (no headers when no answer came)."""
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):  # not wait_for: that wraps every request in a task of its own
            status, response_headers = await connection.get(path, headers)
    except TimeoutError:
        return time.perf_counter() - started, "timeout", {}
    except (OSError, asyncio.IncompleteReadError, ValueError):
        return time.perf_counter() - started, "other", {}
    return time.perf_counter() - started, outcome_of(status), response_headers


async def _httpx_get(
    client: httpx.AsyncClient, path: str, headers: dict[str, str] | None, _timeout_s: float
) -> tuple[float, str, dict[str, str]]:
    seconds, outcome, response = await timed(client, "GET", path, headers=headers)
    return seconds, outcome, dict(response.headers) if response is not None else {}


def retry_delay(headers: dict[str, str]) -> float:
    """Seconds a well-behaved client waits after a 503: its ``Retry-After`` (1 s if absent or odd), at most 10 s."""
    try:
        return min(10.0, max(0.0, float(headers.get("retry-after", "1"))))
    except ValueError:
        return 1.0


async def _poller(plan: PollPlan, job_id: str, measure_from: float, deadline: float, tally: Tally) -> None:
    headers = {"Authorization": f"Bearer {plan.token}"}
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    etag: str | None = None
    if plan.client == "raw":
        connection: Any = RawHttpConnection(plan.url, headers)
        get: Getter = _raw_get
    else:
        connection = httpx.AsyncClient(base_url=plan.url, timeout=plan.timeout_s, limits=limits, headers=headers)
        get = _httpx_get
    try:
        await asyncio.sleep(random.uniform(0.0, plan.think_s))  # pollers start at random phases, not in one burst
        while (started := time.monotonic()) < deadline:
            condition = {"If-None-Match": etag} if plan.conditional and etag else None
            seconds, outcome, response_headers = await get(connection, f"/jobs/{job_id}", condition, plan.timeout_s)
            if started >= measure_from:
                tally.add(seconds, outcome)
            if outcome == "ok":
                etag = response_headers.get("etag") or etag
            pause = retry_delay(response_headers) if outcome == "503" else plan.think_s
            if pause > 0:
                await asyncio.sleep(pause)
    finally:
        if plan.client == "raw":
            connection.close()
        else:
            await connection.aclose()


async def _poll_all(plan: PollPlan) -> Tally:
    tally = Tally()
    start = time.monotonic()
    measure_from, deadline = start + plan.warmup_s, start + plan.warmup_s + plan.duration_s
    await asyncio.gather(*(_poller(plan, job_id, measure_from, deadline, tally) for job_id in plan.job_ids))
    return tally


def poll_share(plan: PollPlan) -> dict[str, Any]:
    """Run ``plan``'s pollers (in this process, to the end): ``{"latencies", "outcomes", "cpu_s"}`` (this process's CPU time)."""
    started = time.process_time()
    tally = uvloop.run(_poll_all(plan))  # the event loop uvicorn serves with: about half asyncio's CPU per request
    return {"latencies": tally.latencies, "outcomes": dict(tally.outcomes), "cpu_s": time.process_time() - started}


async def probe(
    url: str, token: str, spec: dict[str, Any], duration_s: float, interval_s: float, timeout_s: float
) -> dict[str, Tally]:
    """Every ``interval_s`` for ``duration_s``: submit a job, cancel it, ask ``/healthz``; each call's tally."""
    tallies = {"submit": Tally(), "cancel": Tally(), "healthz": Tally()}
    deadline = time.monotonic() + duration_s
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, headers=headers) as client:
        while time.monotonic() < deadline:
            began = time.monotonic()
            seconds, outcome, response = await timed(client, "POST", "/jobs", expected=201, json=spec)
            tallies["submit"].add(seconds, outcome)
            if response is not None and outcome == "ok":
                seconds, outcome, _ = await timed(client, "POST", f"/jobs/{response.json()['id']}/cancel", expected=202)
                tallies["cancel"].add(seconds, outcome)
            seconds, outcome, _ = await timed(client, "GET", "/healthz")
            tallies["healthz"].add(seconds, outcome)
            await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - began)))
    return tallies


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of ascending ``sorted_values`` (nearest rank); NaN when empty."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def summary(tally: Tally, duration_s: float) -> dict[str, Any]:
    """Requests, answers per second, p50/p95/p99/max in milliseconds, and the outcome counts."""
    values = sorted(tally.latencies)
    answered = sum(tally.outcomes.get(name, 0) for name in ANSWERS)
    errors = {name: count for name, count in tally.outcomes.items() if name not in ANSWERS}
    return {
        "requests": len(values),
        "answers_per_s": answered / duration_s if duration_s else math.nan,
        "p50_ms": percentile(values, 0.50) * 1e3,
        "p95_ms": percentile(values, 0.95) * 1e3,
        "p99_ms": percentile(values, 0.99) * 1e3,
        "max_ms": (values[-1] * 1e3) if values else math.nan,
        "outcomes": dict(tally.outcomes),
        "errors": errors,
    }
