"""``HALFCAST_POLL_READS=notified``: polls keep a read until PostgreSQL notifies a change (migration 0017).

Through the real app on the PostgreSQL test database: a poll of an unchanged job reads nothing,
a change written directly (as the worker, the reaper or the CLI write) shows once PostgreSQL has
told it, for each table the resource is read from; a listener cut off by the server forgets
everything and keeps nothing until it listens again; a listener that cannot hear other sessions'
notifications never syncs; SQLite is refused. It is the default (``auto``) on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from api_support import FakeQueue, insert_job, make_token
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError
from sqlalchemy import insert, text, update
from sqlalchemy.orm import Session, sessionmaker

from halfcast.contracts.status import JobStatus
from halfcast.core.db.async_pool import Connect
from halfcast.core.db.change_feed import Change, ChangeFeed, ChangeKind, parse_change
from halfcast.core.db.engine import make_engine
from halfcast.core.db.job_readers import JobReads, async_connector
from halfcast.core.db.job_reads import JobRead
from halfcast.core.db.models import ApiToken, Attempt, Job, StepRow, utcnow
from halfcast.core.db.transitions import Expected, lock_if
from halfcast.core.settings import PollReads, Settings
from server.app import create_app, recent_reads
from server.http.recent_reads import RecentJobReads

pytestmark = pytest.mark.postgres

#: How long a notification may take to arrive here (it takes about a millisecond on a quiet host).
TOLD_WITHIN_S = 10.0


@pytest.fixture
def database_url(database_url: str) -> str:
    """The PostgreSQL test database only (SQLite notifies nothing)."""
    if not database_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only")
    return database_url


@pytest.fixture
def notified(settings: Settings, auth_headers: dict[str, str]) -> Iterator[TestClient]:
    """A client of an app with ``poll_reads=notified``, once its change feed listens."""
    app = create_app(settings.model_copy(update={"poll_reads": PollReads.NOTIFIED}), FakeQueue())
    with TestClient(app, headers=auth_headers) as client:
        _wait_for(lambda: app.state.change_feed.listening)
        yield client


def _reads(client: TestClient) -> RecentJobReads:
    assert isinstance(client.app, FastAPI)
    reads = recent_reads(client.app)
    assert reads is not None
    return reads


def _wait_for(condition: Callable[[], Any], within_s: float = TOLD_WITHIN_S) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.01)


def _polls_until(client: TestClient, job_id: str, field: str, expected: object) -> None:
    _wait_for(lambda: client.get(f"/jobs/{job_id}").json().get(field) == expected)


def _kept_poll(client: TestClient, job_id: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The resource, once its read is kept: the notifications of the arranging writes (and of the token's
    first use, which the first read refreshes) have arrived and dropped what they drop."""
    client.get(f"/jobs/{job_id}", headers=headers)
    time.sleep(0.2)
    answer = client.get(f"/jobs/{job_id}", headers=headers)
    assert answer.status_code == 200 and _reads(client).keeps(job_id)
    resource: dict[str, Any] = answer.json()
    return resource


def _series(client: TestClient) -> dict[str, float]:
    """The ``halfcast_poll_*`` samples of ``GET /metrics``, by name and labels (``name{label=value}``)."""
    samples = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name.startswith("halfcast_poll_"):
                labels = ",".join(f"{key}={value}" for key, value in sorted(sample.labels.items()))
                samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def _write(sessions: sessionmaker[Session], statement: Any) -> None:
    with sessions() as session:
        session.execute(statement)
        session.commit()


class _Counted:
    """The app's reads, counted."""

    def __init__(self, inner: JobReads) -> None:
        self.inner = inner
        self.count = 0

    async def read(self, job_id: str, token_hash: str | None) -> JobRead:
        self.count += 1
        return await self.inner.read(job_id, token_hash)

    async def close(self) -> None:
        await self.inner.close()


def test_a_poll_of_an_unchanged_job_reads_nothing(notified: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions, status="running", owner="tester")
    reads = _reads(notified)
    reads.inner = counted = _Counted(reads.inner)
    first = _kept_poll(notified, job_id)
    before = counted.count
    kept_before = _series(notified)["halfcast_poll_reads_total{answered_from=kept}"]
    for _ in range(5):
        assert notified.get(f"/jobs/{job_id}").json() == first
    assert counted.count == before
    series = _series(notified)
    assert series["halfcast_poll_reads_total{answered_from=kept}"] == kept_before + 5
    assert series["halfcast_poll_reads_total{answered_from=database}"] == counted.count
    assert series["halfcast_poll_reads_total{answered_from=shared}"] == 0  # one poll at a time: none under way
    assert series["halfcast_poll_change_feed_listening"] == 1 and series["halfcast_poll_change_feed_losses_total"] == 0


def test_a_step_written_directly_shows_once_told(notified: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions, status="running", owner="tester")
    other = insert_job(sessions, status="running", owner="tester")
    _kept_poll(notified, other)
    assert _kept_poll(notified, job_id)["step"] == 0
    _write(sessions, update(Job).where(Job.id == job_id).values(step=7))
    _polls_until(notified, job_id, "step", 7)
    assert _reads(notified).keeps(other)  # the other job's read was not dropped


def test_step_records_stored_under_the_rows_lock_tell_no_change(
    notified: TestClient, sessions: sessionmaker[Session], engine: Any
) -> None:
    """Between two writes of the job row (worker/records/pacing.py) the worker only locks it: no change is told."""
    job_id = insert_job(sessions, status="running", owner="tester")
    _kept_poll(notified, job_id)
    with engine.begin() as conn:
        assert lock_if(conn, job_id, Expected.of(JobStatus.RUNNING))
        conn.execute(insert(StepRow).values(job_id=job_id, step=1, time=1.0, data={"step": 1, "time": 1.0}))
    time.sleep(0.3)  # what a notification would have needed, many times over
    assert _reads(notified).keeps(job_id)
    _write(sessions, update(Job).where(Job.id == job_id).values(step=1))  # the row's write: told
    _wait_for(lambda: not _reads(notified).keeps(job_id))


def test_a_new_attempt_shows_once_told(notified: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions, status="running", owner="tester")
    assert _kept_poll(notified, job_id)["attempts"] == []
    _write(sessions, insert(Attempt).values(job_id=job_id, attempt=1, worker_id="w1", started_at=utcnow()))
    _wait_for(lambda: len(notified.get(f"/jobs/{job_id}").json()["attempts"]) == 1)


def test_a_token_revoked_directly_is_refused_once_told(
    notified: TestClient, sessions: sessionmaker[Session], database_url: str
) -> None:
    job_id = insert_job(sessions, status="running", owner="someone")
    secret = make_token(database_url, "someone")
    mine = {"Authorization": f"Bearer {secret}"}
    _kept_poll(notified, job_id, mine)
    _write(sessions, update(ApiToken).where(ApiToken.owner == "someone").values(revoked_at=utcnow()))
    _wait_for(lambda: notified.get(f"/jobs/{job_id}", headers=mine).status_code == 401)


def test_a_lost_listener_keeps_nothing_until_it_listens_again(
    notified: TestClient, sessions: sessionmaker[Session], engine: Any
) -> None:
    job_id = insert_job(sessions, status="running", owner="tester")
    reads = _reads(notified)
    reads.inner = counted = _Counted(reads.inner)
    _kept_poll(notified, job_id)
    assert isinstance(notified.app, FastAPI)
    notified.app.state.change_feed.retry_s = 1.0  # long enough to poll while it is not listening
    with engine.begin() as conn:  # the server drops the listening connection
        conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE query = 'LISTEN halfcast_job_reads' AND datname = current_database()"  # not other tests'
            )
        )
    _wait_for(lambda: reads.max_age_s == 0.0)
    assert len(reads) == 0
    series = _series(notified)
    assert series["halfcast_poll_change_feed_listening"] == 0 and series["halfcast_poll_change_feed_losses_total"] == 1
    before = counted.count
    notified.get(f"/jobs/{job_id}")
    notified.get(f"/jobs/{job_id}")
    assert counted.count == before + 2 and len(reads) == 0
    _wait_for(lambda: reads.max_age_s == float("inf"))  # listening again, on a new connection
    _write(sessions, update(Job).where(Job.id == job_id).values(step=9))
    _polls_until(notified, job_id, "step", 9)


def test_by_default_polls_on_postgresql_keep_reads_until_told(
    data_dir: Path, database_url: str, auth_headers: dict[str, str], sessions: sessionmaker[Session]
) -> None:
    app = create_app(Settings(data_dir=data_dir, database_url=database_url, broker_url=None), FakeQueue())
    with TestClient(app, headers=auth_headers) as client:
        feed = app.state.change_feed
        assert isinstance(feed, ChangeFeed)
        _wait_for(lambda: feed.listening)
        job_id = insert_job(sessions, status="running", owner="tester")
        _kept_poll(client, job_id)
        _write(sessions, update(Job).where(Job.id == job_id).values(step=5))
        _polls_until(client, job_id, "step", 5)


@pytest.mark.parametrize(
    ("database_url", "poll_reads"),
    [
        (None, PollReads.DATABASE),  # the embedded SQLite file
        ("sqlite:///elsewhere.db", PollReads.DATABASE),
        ("postgresql://h/db", PollReads.NOTIFIED),
        ("postgres://h/db", PollReads.NOTIFIED),
        ("postgresql+psycopg://h/db", PollReads.NOTIFIED),
        ("postgresql+psycopg2://h/db", PollReads.DATABASE),  # the change feed listens through psycopg 3
    ],
)
def test_auto_is_notified_on_postgresql_through_psycopg(
    tmp_path: Path, database_url: str | None, poll_reads: PollReads
) -> None:
    settings = Settings(data_dir=tmp_path, database_url=database_url)
    assert settings.poll_reads is PollReads.AUTO and settings.effective_poll_reads is poll_reads
    explicit = Settings(data_dir=tmp_path, database_url=database_url, poll_reads=PollReads.DATABASE)
    assert explicit.effective_poll_reads is PollReads.DATABASE


def _feed_for(connects: list[str], told: _Told) -> ChangeFeed:
    """A feed whose connections go, in turn, to ``connects``' databases (the listener's first, the probes' next)."""
    turn = iter(range(10**6))

    async def connect() -> psycopg.AsyncConnection:
        url = connects[next(turn) % len(connects)].replace("+psycopg", "")
        return await psycopg.AsyncConnection.connect(url, autocommit=True)

    wired: Connect = connect
    return ChangeFeed(wired, told, check_interval_s=0.1, check_timeout_s=0.3, retry_s=0.1, max_retry_s=0.1)


async def _run_for(feeds: list[ChangeFeed], seconds: float) -> None:
    tasks = [asyncio.create_task(feed.run()) for feed in feeds]
    await asyncio.sleep(seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_a_listener_deaf_to_other_sessions_never_syncs(database_url: str, postgres_admin_url: str) -> None:
    """A probe committed on another database never reaches the listener (as none does through a pooler in
    transaction mode): the feed never tells ``synced``, so polls keep reading the database."""
    told = _Told()
    asyncio.run(_run_for([_feed_for([database_url, postgres_admin_url], told)], 1.5))
    assert told.told and set(told.told) == {"lost"}


def test_feeds_hear_each_others_probes_as_nothing(database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    one, other = _Told(), _Told()
    asyncio.run(_run_for([_feed_for([database_url], one), _feed_for([database_url], other)], 1.0))
    assert one.told == ["synced"] and other.told == ["synced"]  # probed every 0.1 s, each told no change
    assert not [record for record in caplog.records if record.levelname == "WARNING"]


def test_a_feed_stops_whenever_it_is_stopped(database_url: str) -> None:
    """Stopped at 150 moments of its start, probes and listening, a feed ends at once every time (cancelled
    once, about one in ten went on listening: an API's shutdown waited for it forever)."""
    moments = random.Random(31)

    async def scenario() -> float:
        slowest = 0.0
        for _ in range(150):
            feed = _feed_for([database_url], _Told())
            running = feed.running()
            await running.__aenter__()
            await asyncio.sleep(moments.uniform(0.0, 0.02))
            began = time.monotonic()
            await asyncio.wait_for(running.__aexit__(None, None, None), 2.0)
            slowest = max(slowest, time.monotonic() - began)
        return slowest

    assert asyncio.run(scenario()) < 2.0


def test_notified_reads_need_postgresql(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="poll_reads=notified needs PostgreSQL"):
        Settings(data_dir=tmp_path, database_url=None, poll_reads=PollReads.NOTIFIED)


class _Told:
    """A ChangeListener that records what it is told."""

    def __init__(self) -> None:
        self.told: list[str | Change] = []

    def synced(self) -> None:
        self.told.append("synced")

    def lost(self) -> None:
        self.told.append("lost")

    def changed(self, change: Change) -> None:
        self.told.append(change)


@pytest.mark.parametrize("table", ["jobs", "attempts", "job_members", "api_tokens"])
def test_every_table_the_resource_reads_tells_its_changes(
    table: str, database_url: str, sessions: sessionmaker[Session]
) -> None:
    job_id = insert_job(sessions, status="running", owner="tester")
    writes = {
        "jobs": f"UPDATE jobs SET step = 3 WHERE id = '{job_id}'",
        "attempts": f"INSERT INTO attempts (job_id, attempt, worker_id, started_at) VALUES ('{job_id}', 1, 'w', now())",
        "job_members": "INSERT INTO job_members (job_id, attempt, node_rank, worker_id, status, joined_at)"
        f" VALUES ('{job_id}', 1, 0, 'w', 'joined', now())",
        "api_tokens": "UPDATE api_tokens SET last_used_at = now()",
    }
    expected = Change(ChangeKind.TOKEN, "1") if table == "api_tokens" else Change(ChangeKind.JOB, job_id)

    async def scenario() -> list[str | Change]:
        told = _Told()
        engine = make_engine(database_url)
        connect = async_connector(engine)
        assert connect is not None
        feed = ChangeFeed(connect, told)
        task = asyncio.create_task(feed.run())
        while not feed.listening:
            await asyncio.sleep(0.01)
        async with await psycopg.AsyncConnection.connect(
            database_url.replace("+psycopg", ""), autocommit=True
        ) as writer:
            if table == "job_members":
                await writer.execute(writes["attempts"])
            await writer.execute(writes[table])
        deadline = time.monotonic() + TOLD_WITHIN_S
        while expected not in told.told and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        task.cancel()
        engine.dispose()
        return told.told

    if table == "api_tokens":
        make_token(database_url, "tester")
    told = asyncio.run(scenario())
    assert told[0] == "synced" and expected in told


@pytest.mark.parametrize(
    ("payload", "change"),
    [
        ("job:abc", Change(ChangeKind.JOB, "abc")),
        ("token:12", Change(ChangeKind.TOKEN, "12")),
        ("job:", None),
        ("worker:1", None),
        ("nonsense", None),
    ],
)
def test_a_payload_tells_a_job_or_a_token(payload: str, change: Change | None) -> None:
    assert parse_change(payload) == change
