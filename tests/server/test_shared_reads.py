"""``server.streams.shared_reads``: one read per key per tick, shared by every caller; cancellation and errors."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest
from sqlalchemy.orm import Session, sessionmaker

from server.streams.events import database_poller
from server.streams.shared_reads import SharedReads, StreamReads, next_tick_delay


class Clock:
    """A settable ``time.monotonic`` stand-in."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _slow_read(log: list[str], value: str, gate: anyio.Event | None = None) -> Callable[[], Awaitable[str]]:
    async def read() -> str:
        log.append(value)
        if gate is not None:
            await gate.wait()
        else:
            await anyio.sleep(0.01)
        return value

    return read


def test_callers_asking_the_same_key_at_once_share_one_read() -> None:
    shared: SharedReads[str] = SharedReads(fresh_s=0.05)
    reads: list[str] = []
    results: list[str] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for n in range(20):
                tg.start_soon(_get, n)

    async def _get(n: int) -> None:
        results.append(await shared.get(("job", 3), _slow_read(reads, f"read by {n}")))

    anyio.run(main)
    assert reads == ["read by 0"] and results == ["read by 0"] * 20
    assert shared.reads == 1 and shared.shared == 19


def test_different_keys_are_read_separately() -> None:
    shared: SharedReads[str] = SharedReads(fresh_s=10)
    reads: list[str] = []

    async def main() -> list[str]:
        return [await shared.get(key, _slow_read(reads, key)) for key in ("a", "b", "a")]

    assert anyio.run(main) == ["a", "b", "a"]
    assert reads == ["a", "b"]


def test_a_result_is_reused_only_within_fresh_s_of_the_reads_start() -> None:
    clock = Clock()
    shared: SharedReads[str] = SharedReads(fresh_s=0.5, clock=clock)
    reads: list[str] = []

    async def main() -> list[str]:
        first = await shared.get("k", _slow_read(reads, "first"))
        clock.now += 0.25
        again = await shared.get("k", _slow_read(reads, "unused"))
        clock.now += 0.25  # exactly fresh_s after the read started: too old
        later = await shared.get("k", _slow_read(reads, "second"))
        return [first, again, later]

    assert anyio.run(main) == ["first", "first", "second"]
    assert reads == ["first", "second"]


def test_a_cancelled_leader_hands_the_read_to_a_waiter() -> None:
    shared: SharedReads[str] = SharedReads(fresh_s=10)
    reads: list[str] = []
    got: list[str] = []

    async def main() -> None:
        gate = anyio.Event()
        with anyio.fail_after(5):
            await _race(gate)

    async def _race(gate: anyio.Event) -> None:
        async with anyio.create_task_group() as tg:
            leader_scope = anyio.CancelScope()

            async def leader() -> None:
                with leader_scope:
                    await shared.get("k", _slow_read(reads, "leader", gate))

            async def waiter() -> None:
                got.append(await shared.get("k", _slow_read(reads, "waiter")))

            tg.start_soon(leader)
            await anyio.sleep(0.01)
            tg.start_soon(waiter)
            await anyio.sleep(0.01)
            leader_scope.cancel()  # the leader's client went away mid-read

    anyio.run(main)
    assert reads == ["leader", "waiter"] and got == ["waiter"]


def test_an_error_is_raised_to_every_caller_that_shared_the_read() -> None:
    shared: SharedReads[str] = SharedReads(fresh_s=10)
    errors: list[BaseException] = []
    calls: list[int] = []

    async def failing() -> str:
        calls.append(1)
        await anyio.sleep(0.01)
        raise ConnectionError("database is down")

    async def get() -> None:
        try:
            await shared.get("k", failing)
        except ConnectionError as exc:
            errors.append(exc)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(get)

    anyio.run(main)
    assert len(calls) == 1 and len(errors) == 3


def test_finished_entries_are_swept_after_their_window() -> None:
    clock = Clock()
    shared: SharedReads[str] = SharedReads(fresh_s=0.05, clock=clock)

    async def main() -> None:
        for n in range(50):
            await shared.get(("job", n), _slow_read([], "x"))
        clock.now += 1
        await shared.get("new", _slow_read([], "y"))

    anyio.run(main)
    assert list(shared._entries) == ["new"]


def test_fresh_s_must_be_positive() -> None:
    with pytest.raises(ValueError, match="fresh_s"):
        SharedReads(fresh_s=0)


def test_streams_of_one_job_wake_at_the_same_ticks_and_jobs_are_spread() -> None:
    interval = 0.1
    wakes = {round((now + next_tick_delay("job-a", interval, now)) % interval, 9) for now in (5.0, 5.013, 5.0371, 5.09)}
    assert len(wakes) == 1  # one phase for every stream of a job, whenever it asks
    phases = {round((5.0 + next_tick_delay(f"job-{n}", interval, 5.0)) % interval, 3) for n in range(50)}
    assert len(phases) > 25  # different jobs poll at different moments
    for now in (0.0, 1.2345, 7.77, 1e6 + 0.05):
        assert interval / 10 <= next_tick_delay("job-a", interval, now) < interval * 1.1


def test_a_caller_refuses_a_read_older_than_one_it_used() -> None:
    clock = Clock()
    shared: SharedReads[str] = SharedReads(fresh_s=10, clock=clock)
    reads: list[str] = []

    async def main() -> list[tuple[str, float]]:
        first = await shared.get_timed("k", _slow_read(reads, "v1"))  # started at 100
        clock.now = 101.0
        same = await shared.get_timed("k", _slow_read(reads, "unused"), not_before=100.0)
        newer = await shared.get_timed("k", _slow_read(reads, "v2"), not_before=100.5)  # saw something from 100.5
        return [first, same, newer]

    assert anyio.run(main) == [("v1", 100.0), ("v1", 100.0), ("v2", 101.0)]
    assert reads == ["v1", "v2"]


def test_a_streams_poller_never_goes_back_to_a_read_older_than_its_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stream A read the job at t=100; stream B read it at t=101 (its first poll); B's next poll asks A's
    question: A's read is fresh but older than what B has shown, so B reads again (else an evaluation or a
    precision switch it already sent could be taken back)."""
    clock = Clock()
    shared: SharedReads[object] = SharedReads(fresh_s=10, clock=clock)
    versions = iter(range(1, 10))
    monkeypatch.setattr("server.streams.events.read_snapshot", lambda *_: f"v{next(versions)}")
    never_opened: sessionmaker[Session] = sessionmaker()  # read_snapshot is replaced
    stream_a = database_poller(never_opened, 500, shared)
    stream_b = database_poller(never_opened, 500, shared)

    async def main() -> list[object]:
        a = await stream_a("job", 10, "running")
        clock.now = 101.0
        b_first = await stream_b("job", 0, None)
        clock.now = 102.0
        b_next = await stream_b("job", 10, "running")
        a_next = await stream_a("job", 10, "running")  # A may share B's newer read
        return [a, b_first, b_next, a_next]

    assert anyio.run(main) == ["v1", "v2", "v3", "v3"]


def test_a_stream_opened_after_a_read_started_never_gets_that_read() -> None:
    """A client set a job's status, then opened a stream: another stream's read of the old status, started
    before and still fresh, is not handed to it (the CLI's ``logs --follow`` exited 1 on a job that had
    just been marked succeeded, one run in a few)."""
    clock = Clock()
    shared: SharedReads[str] = SharedReads(fresh_s=10, clock=clock)
    reads: list[str] = []
    before = StreamReads(shared)

    async def main() -> list[str]:
        old = await before.get("k", _slow_read(reads, "failed"))  # started at 100
        clock.now = 100.5
        after = StreamReads(shared)  # opened after that read started
        new = await after.get("k", _slow_read(reads, "succeeded"))
        shared_again = await StreamReads(shared).get("k", _slow_read(reads, "unused"))  # opened at 100.5 too
        return [old, new, shared_again]

    assert anyio.run(main) == ["failed", "succeeded", "succeeded"]
    assert reads == ["failed", "succeeded"]
