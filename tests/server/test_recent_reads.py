"""``HALFCAST_POLL_MAX_AGE_S`` (server/http/recent_reads.py): polls may reuse a read for that long, never past a write.

On SQLite and PostgreSQL, through the real app with ``HALFCAST_POLL_READS=database`` (the tests'
settings; PostgreSQL's default, ``auto``, keeps reads until notified: tests/server/test_notified_reads.py):
a change made in the database directly (as the worker makes it) shows within the max age, at once with the default (0)
on SQLite; a write through the API shows at once whatever the max age; another token never gets a
kept read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import cast

import pytest
from api_support import FakeQueue, insert_job, make_token
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db.change_feed import Change, ChangeKind
from halfcast.core.db.job_reads import JobRead, JobView, TokenView
from halfcast.core.db.models import Job, utcnow
from halfcast.core.settings import PollReads, Settings
from server.app import create_app, recent_reads
from server.http.recent_reads import RecentJobReads


def _set_step(sessions: sessionmaker[Session], job_id: str, step: int) -> None:
    """What the worker does as a run's records come in: the job row changes in the database, not through the API."""
    with sessions() as session:
        session.execute(update(Job).where(Job.id == job_id).values(step=step))
        session.commit()


def _client(settings: Settings, max_age_s: float, auth_headers: dict[str, str]) -> TestClient:
    """Reads kept ``max_age_s``, never until notified (which a direct write would make stale at once)."""
    kept = settings.model_copy(update={"poll_max_age_s": max_age_s, "poll_reads": PollReads.DATABASE})
    return TestClient(create_app(kept, FakeQueue()), headers=auth_headers)


@pytest.fixture
def kept_client(settings: Settings, auth_headers: dict[str, str]) -> Iterator[TestClient]:
    """A client of an app whose polls reuse a read for a minute: longer than any test here."""
    with _client(settings, 60.0, auth_headers) as client:
        yield client


def test_by_default_every_poll_reads_the_database_on_sqlite(
    settings: Settings, auth_headers: dict[str, str], sessions: sessionmaker[Session], database_url: str
) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("on PostgreSQL polls are notified by default (test_notified_reads.py)")
    defaults = settings.model_copy(update={"poll_reads": PollReads.AUTO})
    job_id = insert_job(sessions, status="running", owner="tester")
    with TestClient(create_app(defaults, FakeQueue()), headers=auth_headers) as client:
        assert client.get(f"/jobs/{job_id}").json()["step"] == 0
        _set_step(sessions, job_id, 7)
        assert client.get(f"/jobs/{job_id}").json()["step"] == 7
        assert isinstance(client.app, FastAPI) and recent_reads(client.app) is None


def test_a_poll_reuses_a_read_younger_than_the_max_age(
    kept_client: TestClient, sessions: sessionmaker[Session]
) -> None:
    job_id = insert_job(sessions, status="running", owner="tester")
    first = kept_client.get(f"/jobs/{job_id}")
    _set_step(sessions, job_id, 7)
    second = kept_client.get(f"/jobs/{job_id}")
    assert second.json()["step"] == 0 and second.headers["etag"] == first.headers["etag"]


def test_a_read_older_than_the_max_age_is_read_again(
    settings: Settings, auth_headers: dict[str, str], sessions: sessionmaker[Session]
) -> None:
    job_id = insert_job(sessions, status="running", owner="tester")
    with _client(settings, 0.2, auth_headers) as client:
        assert client.get(f"/jobs/{job_id}").json()["step"] == 0
        _set_step(sessions, job_id, 7)
        time.sleep(0.25)
        assert client.get(f"/jobs/{job_id}").json()["step"] == 7


def test_a_write_through_the_api_is_seen_by_the_next_poll(
    kept_client: TestClient, sessions: sessionmaker[Session]
) -> None:
    job_id = insert_job(sessions, status="queued", owner="tester")
    assert kept_client.get(f"/jobs/{job_id}").json()["status"] == "queued"
    cancelled = kept_client.post(f"/jobs/{job_id}/cancel")
    assert cancelled.status_code == 202, cancelled.text
    assert kept_client.get(f"/jobs/{job_id}").json()["status"] == cancelled.json()["status"] == "cancelled"


def test_a_failed_write_forgets_too(kept_client: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions, status="running", owner="tester")
    kept_client.get(f"/jobs/{job_id}")
    _set_step(sessions, job_id, 7)
    assert kept_client.post("/jobs", json={"model": "nonsense"}).status_code == 422
    assert kept_client.get(f"/jobs/{job_id}").json()["step"] == 7


def test_another_token_never_gets_a_kept_read(
    kept_client: TestClient, sessions: sessionmaker[Session], database_url: str
) -> None:
    job_id = insert_job(sessions, status="running", owner="tester")
    assert kept_client.get(f"/jobs/{job_id}").status_code == 200
    stranger = {"Authorization": f"Bearer {make_token(database_url, 'someone-else')}"}
    assert kept_client.get(f"/jobs/{job_id}", headers=stranger).status_code == 404
    assert kept_client.get(f"/jobs/{job_id}", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_a_missing_job_is_not_kept(kept_client: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = "0b6c4e52-9a1d-4c39-9f52-6f3f0d8f1a77"
    assert kept_client.get(f"/jobs/{job_id}").status_code == 404
    insert_job(sessions, status="queued", owner="tester", job_id=job_id)
    assert kept_client.get(f"/jobs/{job_id}").status_code == 200


class _GatedReads:
    """JobReads whose reads wait for ``release`` and count themselves: the race between a read and a write."""

    def __init__(self, read: JobRead) -> None:
        self.result = read
        self.release = asyncio.Event()
        self.count = 0

    async def read(self, job_id: str, token_hash: str | None) -> JobRead:
        self.count += 1
        await self.release.wait()
        return self.result

    async def close(self) -> None:
        """Nothing held."""


def _a_read(*, token_found: bool = True) -> JobRead:
    """A read that found the job and, unless ``token_found`` is false, the presented token (stand-ins: only kept)."""
    token = TokenView(id=1, owner="tester", admin=False, revoked_at=None, last_used_at=utcnow())
    return JobRead(job=cast(JobView, object()), token=token if token_found else None)


def test_a_read_under_way_during_a_write_is_not_kept() -> None:
    async def scenario() -> int:
        inner = _GatedReads(_a_read())
        reads = RecentJobReads(inner, max_age_s=60.0)
        pending = asyncio.create_task(reads.read("job", "token"))
        await asyncio.sleep(0)
        reads.forget()  # a write is answered while the read is still at the database
        inner.release.set()
        await pending
        assert len(reads) == 0
        await reads.read("job", "token")
        await reads.read("job", "token")
        return inner.count

    assert asyncio.run(scenario()) == 2  # the raced read, then one kept for the next


def test_the_least_recently_used_read_goes_first_past_the_bound() -> None:
    async def scenario() -> list[int]:
        inner = _GatedReads(_a_read())
        inner.release.set()
        reads = RecentJobReads(inner, max_age_s=60.0, kept=2)
        counts = []
        for job in ("a", "b", "a", "c", "a", "b"):
            await reads.read(job, None)
            counts.append(inner.count)
        return counts

    # a, b read; a kept; c read (b out: a was used since); a kept; b read again
    assert asyncio.run(scenario()) == [1, 2, 2, 3, 3, 4]


def test_a_read_with_an_unknown_token_is_not_kept() -> None:
    async def scenario() -> int:
        inner = _GatedReads(_a_read(token_found=False))  # the presented token is unknown (a 401)
        inner.release.set()
        reads = RecentJobReads(inner, max_age_s=60.0)
        for _ in range(3):
            await reads.read("job", "unknown-token-hash")
        await reads.read("job", None)  # authentication off: no token to find
        await reads.read("job", None)
        return inner.count

    assert asyncio.run(scenario()) == 4


def test_a_kept_read_whose_token_is_due_a_refresh_is_read_again() -> None:
    async def scenario() -> int:
        inner = _GatedReads(_a_read())
        inner.release.set()
        reads = RecentJobReads(inner, max_age_s=float("inf"))
        await reads.read("job", "token")
        await reads.read("job", "token")  # kept
        assert inner.result.token is not None
        stale = replace(inner.result.token, last_used_at=utcnow() - timedelta(hours=1))
        reads.forget()
        inner.result = replace(inner.result, token=stale)  # a read made an hour ago: its token's last use is stale
        await reads.read("job", "token")
        await reads.read("job", "token")  # due: read again, so that the database refreshes it
        return inner.count

    assert asyncio.run(scenario()) == 3  # the first, the one after the forget, the one due


def test_a_change_forgets_only_what_it_makes_stale() -> None:
    async def scenario() -> list[bool]:
        inner = _GatedReads(_a_read())
        inner.release.set()
        reads = RecentJobReads(inner, max_age_s=float("inf"))
        for job in ("a", "b"):
            await reads.read(job, "token")
        reads.changed(Change(ChangeKind.JOB, "a"))
        kept = [reads.keeps("a"), reads.keeps("b")]
        reads.changed(Change(ChangeKind.TOKEN, "2"))  # another token: nothing of it kept
        kept.append(reads.keeps("b"))
        reads.changed(Change(ChangeKind.TOKEN, "1"))  # the token every read here was made with
        kept.append(reads.keeps("b"))
        return kept

    assert asyncio.run(scenario()) == [False, True, True, False]


def test_a_lost_feed_keeps_reads_no_longer_than_the_max_age() -> None:
    reads = RecentJobReads(_GatedReads(_a_read()), max_age_s=0.5)
    reads.synced()
    assert reads.max_age_s == float("inf")
    reads.lost()
    assert reads.max_age_s == 0.5


class _FailingReads(_GatedReads):
    """Gated reads that raise once released while ``failing``: the database went away mid-read."""

    failing = True

    async def read(self, job_id: str, token_hash: str | None) -> JobRead:
        read = await super().read(job_id, token_hash)
        if self.failing:
            raise ConnectionError("the database went away")
        return read


async def _polls_under_way(reads: RecentJobReads, keys: list[tuple[str, str]]) -> list[asyncio.Task[JobRead]]:
    """A poll of each of ``keys`` at once, each begun (at the database or waiting for a read there)."""
    polls = [asyncio.create_task(reads.read(*key)) for key in keys]
    await asyncio.sleep(0)
    return polls


def test_polls_that_miss_together_share_one_read() -> None:
    async def scenario() -> tuple[int, int, int]:
        inner = _GatedReads(_a_read())
        reads = RecentJobReads(inner, max_age_s=float("inf"))
        polls = await _polls_under_way(reads, [("job", "token")] * 5 + [("other", "token")])
        inner.release.set()
        answers = await asyncio.gather(*polls)
        assert all(answer is inner.result for answer in answers)
        await reads.read("job", "token")  # kept since
        return inner.count, reads.answered_shared, reads.answered_kept

    assert asyncio.run(scenario()) == (2, 4, 1)  # one read per key; 4 polls waited for the first


def test_a_change_during_a_shared_read_sends_later_polls_to_the_database() -> None:
    async def scenario() -> tuple[int, bool, bool]:
        inner = _GatedReads(_a_read())
        reads = RecentJobReads(inner, max_age_s=float("inf"))
        before = await _polls_under_way(reads, [("a", "token"), ("b", "token")])
        reads.changed(Change(ChangeKind.JOB, "a"))  # told while both reads are at the database
        after = await _polls_under_way(reads, [("a", "token"), ("a", "token")])
        inner.release.set()
        await asyncio.gather(*before, *after)
        return inner.count, reads.keeps("a"), reads.keeps("b")

    # a's read from before the change is neither joined nor kept; b's, untouched by it, is kept
    assert asyncio.run(scenario()) == (3, True, True)


def test_a_read_begun_before_a_write_is_not_shared_with_polls_after_it() -> None:
    async def scenario() -> tuple[int, int]:
        inner = _GatedReads(_a_read())
        reads = RecentJobReads(inner, max_age_s=float("inf"))
        before = await _polls_under_way(reads, [("job", "token")])
        reads.forget()  # ForgetOnWrite: a write through this API was answered
        after = await _polls_under_way(reads, [("job", "token")])
        inner.release.set()
        await asyncio.gather(*before, *after)
        return inner.count, reads.answered_shared

    assert asyncio.run(scenario()) == (2, 0)


def test_a_poll_whose_client_left_leaves_the_shared_read_to_the_others() -> None:
    async def scenario() -> tuple[int, bool]:
        inner = _GatedReads(_a_read())
        reads = RecentJobReads(inner, max_age_s=float("inf"))
        first, second = await _polls_under_way(reads, [("job", "token")] * 2)
        first.cancel()
        await asyncio.sleep(0)
        inner.release.set()
        assert await second is inner.result
        return inner.count, reads.keeps("job")

    assert asyncio.run(scenario()) == (1, True)


def test_a_failed_shared_read_fails_every_poll_waiting_and_keeps_nothing() -> None:
    async def scenario() -> tuple[list[bool], int]:
        inner = _FailingReads(_a_read())
        reads = RecentJobReads(inner, max_age_s=float("inf"))
        polls = await _polls_under_way(reads, [("job", "token")] * 3)
        inner.release.set()
        answers = await asyncio.gather(*polls, return_exceptions=True)
        failed = [isinstance(answer, ConnectionError) for answer in answers]
        inner.failing = False  # the database is back
        await reads.read("job", "token")
        return failed, inner.count

    assert asyncio.run(scenario()) == ([True, True, True], 2)


def test_without_a_max_age_polls_never_share_a_read() -> None:
    async def scenario() -> int:
        inner = _GatedReads(_a_read())
        reads = RecentJobReads(inner, max_age_s=0.0)  # a lost feed with HALFCAST_POLL_MAX_AGE_S=0
        polls = await _polls_under_way(reads, [("job", "token")] * 3)
        inner.release.set()
        await asyncio.gather(*polls)
        return inner.count

    assert asyncio.run(scenario()) == 3
