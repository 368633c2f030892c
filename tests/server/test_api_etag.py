"""Conditional ``GET /jobs/{id}``: a strong ETag that changes with every part of the resource, and 304 on a match.

On SQLite and PostgreSQL. Each mutation below changes one part of the resource
directly in the database (as the worker or a cancel would), without touching the
others (an attempt's row without the job's, ``eval`` without ``step``...): a client
holding the old tag must get the new state, never a 304.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from api_support import BASE_TIME, app_state, insert_job, make_token
from fastapi.testclient import TestClient
from sqlalchemy import insert, update
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db.job_reads import AttemptView, JobView, MemberView
from halfcast.core.db.models import Attempt, Job
from server.http.etags import job_etag
from server.routes.job_resource import RenderedBodies

Mutation = Callable[[sessionmaker[Session], str], None]


def _job(sessions: sessionmaker[Session], job_id: str, **values: Any) -> None:
    with sessions() as session:
        session.execute(update(Job).where(Job.id == job_id).values(**values))
        session.commit()


def _attempt(sessions: sessionmaker[Session], job_id: str, **values: Any) -> None:
    with sessions() as session:
        session.execute(update(Attempt).where(Attempt.job_id == job_id, Attempt.attempt == 1).values(**values))
        session.commit()


def _add_attempt(sessions: sessionmaker[Session], job_id: str) -> None:
    with sessions() as session:
        session.execute(insert(Attempt).values(job_id=job_id, attempt=2, worker_id="w/2", started_at=BASE_TIME))
        session.commit()


SWITCH = {
    "step": 7,
    "from": "fp16",
    "to": "bf16",
    "reason": "nonfinite_gradients",
    "message": "m",
    "rewound_to_step": 5,
}

#: One change to each part of the resource (the job row's fields, an attempt's, the attempts list).
MUTATIONS: dict[str, Mutation] = {
    "status": lambda s, j: _job(s, j, status="cancelling"),
    "step and latest": lambda s, j: _job(s, j, step=4, latest={"step": 4, "loss": 0.25}),
    "latest only": lambda s, j: _job(s, j, latest={"step": 3, "loss": 0.5}),
    "eval": lambda s, j: _job(s, j, eval={"step": 3, "time": 1.0, "loss": 0.4, "accuracy": 0.9}),
    "error": lambda s, j: _job(s, j, error_reason="oom", error_message="out of memory"),
    "finished_at": lambda s, j: _job(s, j, finished_at=BASE_TIME + timedelta(hours=1)),
    "started_at": lambda s, j: _job(s, j, started_at=BASE_TIME + timedelta(seconds=1)),
    "precision switch": lambda s, j: _job(s, j, precision_switches=[SWITCH]),
    "end record": lambda s, j: _job(s, j, end_info={"steps": 3, "skipped_steps": 0, "exported_step": 2}),
    "world_size": lambda s, j: _job(s, j, world_size=2),
    "attempt counter": lambda s, j: _job(s, j, attempt=2),
    "name": lambda s, j: _job(s, j, name="renamed"),
    "spec": lambda s, j: _job(s, j, spec={"name": "x", "precision": "bf16"}),
    "new attempt row": _add_attempt,
    "attempt ended": lambda s, j: _attempt(
        s, j, ended_at=BASE_TIME + timedelta(minutes=1), status="failed", reason="worker_lost"
    ),
    "attempt reason only": lambda s, j: _attempt(s, j, reason="worker_shutdown"),
    "attempt gpus": lambda s, j: _attempt(s, j, gpus=[0, 1]),
}


@pytest.fixture
def running_job(sessions: sessionmaker[Session]) -> str:
    """A running job with one attempt and a step record in ``latest``."""
    job_id = insert_job(sessions, status="running", latest={"step": 3, "loss": 0.3})
    _job(sessions, job_id, started_at=BASE_TIME)
    with sessions() as session:
        session.execute(insert(Attempt).values(job_id=job_id, attempt=1, worker_id="w/1", started_at=BASE_TIME))
        session.commit()
    return job_id


def test_get_answers_a_strong_etag_and_304_when_it_is_current(client: TestClient, running_job: str) -> None:
    first = client.get(f"/jobs/{running_job}")
    etag = first.headers["etag"]
    assert first.status_code == 200 and etag.startswith('"') and etag.endswith('"') and not etag.startswith("W/")
    assert first.headers["cache-control"] == "private, no-cache"
    assert client.get(f"/jobs/{running_job}").headers["etag"] == etag  # same state, same tag
    for header in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        again = client.get(f"/jobs/{running_job}", headers={"If-None-Match": header})
        assert again.status_code == 304, header
        assert again.content == b"" and again.headers["etag"] == etag
    stale = client.get(f"/jobs/{running_job}", headers={"If-None-Match": '"not-it"'})
    assert stale.status_code == 200 and stale.json() == first.json()


@pytest.mark.parametrize("mutation", MUTATIONS.values(), ids=list(MUTATIONS))
def test_every_change_to_the_resource_changes_the_etag(
    client: TestClient, sessions: sessionmaker[Session], running_job: str, mutation: Mutation
) -> None:
    before = client.get(f"/jobs/{running_job}")
    mutation(sessions, running_job)
    after = client.get(f"/jobs/{running_job}", headers={"If-None-Match": before.headers["etag"]})
    assert after.status_code == 200
    assert after.headers["etag"] != before.headers["etag"]
    assert after.json() != before.json()
    assert client.get(f"/jobs/{running_job}", headers={"If-None-Match": after.headers["etag"]}).status_code == 304


def test_bookkeeping_that_the_resource_does_not_show_keeps_the_etag(
    client: TestClient, sessions: sessionmaker[Session], running_job: str
) -> None:
    etag = client.get(f"/jobs/{running_job}").headers["etag"]
    _job(
        sessions, running_job, lease_expires_at=BASE_TIME + timedelta(days=1), updated_at=BASE_TIME + timedelta(days=1)
    )
    assert client.get(f"/jobs/{running_job}", headers={"If-None-Match": etag}).status_code == 304


def test_no_304_for_a_job_the_caller_cannot_see_or_without_a_valid_token(
    client: TestClient, database_url: str, running_job: str
) -> None:
    etag = client.get(f"/jobs/{running_job}").headers["etag"]
    stranger = {"Authorization": f"Bearer {make_token(database_url, 'stranger')}"}
    for header in (etag, "*"):
        assert client.get(f"/jobs/{running_job}", headers={**stranger, "If-None-Match": header}).status_code == 404
        denied = client.get(
            f"/jobs/{running_job}", headers={"Authorization": "Bearer hc_unknown", "If-None-Match": header}
        )
        assert denied.status_code == 401 and denied.headers["www-authenticate"] == "Bearer"
    assert client.get("/jobs/nope", headers={"If-None-Match": "*"}).status_code == 404


def _view(**changes: Any) -> JobView:
    """A job view with one attempt and one gang membership (every field set), with ``changes``."""
    attempt = AttemptView(1, "w/1", BASE_TIME, None, None, None, [0], None)
    member = MemberView(1, 0, "w/1", "10.0.0.1", "joined", None, BASE_TIME, None)
    values: dict[str, Any] = {
        "id": "j1",
        "owner": "alice",
        "name": "n",
        "status": "running",
        "spec": {"name": "n", "nodes": 2, "lr": 0.1},
        "created_at": BASE_TIME,
        "started_at": BASE_TIME,
        "finished_at": None,
        "error_reason": None,
        "error_message": None,
        "step": 3,
        "max_steps": 10,
        "world_size": 2,
        "latest": {"step": 3, "loss": 0.5},
        "eval": None,
        "attempt": 1,
        "precision_switches": [],
        "end_info": None,
        "startup": {"phase": "training"},
        "data_report": {"rows": 12, "dropped_rows": {"train": 1, "held_out": 0}},
        "attempts": (attempt,),
        "members": (member,),
    }
    return JobView(**{**values, **changes})


def _other(value: Any) -> Any:
    """A value of the same kind as ``value`` that differs from it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, datetime):
        return value + timedelta(microseconds=1)
    if isinstance(value, dict):
        return {**value, "extra": 1}
    if isinstance(value, list):
        return [*value, 1]
    return "set"  # None


def test_the_tag_covers_every_field_of_the_job_its_attempts_and_members() -> None:
    base = _view()
    tag = job_etag(base)
    assert job_etag(_view()) == tag  # equal views, equal tags (other objects)
    for field in fields(JobView):
        if field.name in ("attempts", "members"):
            continue
        changed = replace(base, **{field.name: _other(getattr(base, field.name))})
        assert job_etag(changed) != tag, field.name
    for field in fields(AttemptView):
        attempt = replace(base.attempts[0], **{field.name: _other(getattr(base.attempts[0], field.name))})
        assert job_etag(replace(base, attempts=(attempt,))) != tag, field.name
    for field in fields(MemberView):
        member = replace(base.members[0], **{field.name: _other(getattr(base.members[0], field.name))})
        assert job_etag(replace(base, members=(member,))) != tag, field.name
    assert job_etag(replace(base, attempts=())) != tag and job_etag(replace(base, members=())) != tag
    assert job_etag(replace(base, step=True)) != job_etag(replace(base, step=1))  # types count, not only text
    assert job_etag(replace(base, latest={"loss": 1.0})) != job_etag(replace(base, latest={"loss": 1}))
    naive = replace(base, finished_at=BASE_TIME.replace(tzinfo=None))
    assert job_etag(naive) != job_etag(replace(base, finished_at=BASE_TIME.replace(tzinfo=UTC)))


def test_a_value_marshal_cannot_write_still_gets_a_tag() -> None:
    odd = _view(latest={"loss": Decimal("0.5")})
    assert job_etag(odd) == job_etag(_view(latest={"loss": Decimal("0.5")}))
    assert job_etag(odd) != job_etag(_view(latest={"loss": Decimal("0.25")}))


def test_same_tag_same_bytes_and_a_kept_body_per_state(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions, status="running", latest={"step": 3, "loss": 0.3})
    bodies = app_state(client.app).rendered_bodies
    first = client.get(f"/jobs/{job_id}")
    assert client.get(f"/jobs/{job_id}").content == first.content and len(bodies) == 1  # rendered once, kept
    _job(sessions, job_id, step=4, latest={"step": 4, "loss": 0.25})
    second = client.get(f"/jobs/{job_id}")
    assert second.headers["etag"] != first.headers["etag"] and second.json()["latest"]["step"] == 4
    assert len(bodies) == 2


def test_kept_bodies_are_bounded_least_recently_used_out_first() -> None:
    bodies = RenderedBodies(kept=2)
    views = {tag: _view(step=step) for tag, step in (("a", 1), ("b", 2), ("c", 3))}
    first = bodies.body("a", views["a"])
    bodies.body("b", views["b"])
    assert bodies.body("a", views["b"]) is first  # kept: the tag decides
    bodies.body("c", views["c"])  # "b" was used least recently
    assert len(bodies) == 2 and json.loads(bodies.body("b", views["b"]))["step"] == 2


def test_a_views_tag_is_hashed_once_per_view_object(monkeypatch: pytest.MonkeyPatch) -> None:
    hashed: list[JobView] = []

    def counted(job: JobView) -> str:
        hashed.append(job)
        return job_etag(job)

    monkeypatch.setattr("server.routes.job_resource.job_etag", counted)
    bodies = RenderedBodies(kept=2)
    kept, equal, other = _view(step=1), _view(step=1), _view(step=2)
    tags = [bodies.tag(view) for view in (kept, kept, kept, equal, other)]
    assert tags[:4] == [job_etag(kept)] * 4 and tags[4] == job_etag(other)
    assert [id(view) for view in hashed] == [id(kept), id(equal), id(other)]  # a kept read's view: hashed once
    bodies.tag(_view(step=3))  # past the bound: the least recently used view is dropped, and hashed again
    bodies.tag(kept)
    assert len(hashed) == 5 and hashed[-1] is kept
