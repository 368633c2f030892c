"""``on_divergence`` in the API: 422 unless fp16; the resource's ``precision_switches`` and ``effective_precision``;
the event stream announces a switch and rewinds to it."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import anyio
from api_support import VALID_SPEC, record_step
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db.models import Job
from server.streams.events import Snapshot, job_events
from server.streams.stats import EventStreamSettings, StreamStats

SWITCH = {
    "step": 12,
    "from": "fp16",
    "to": "bf16",
    "reason": "loss_scale_collapsed",
    "message": "collapsed",
    "rewound_to_step": 8,
    "time": 50.0,
}


def _spec(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(VALID_SPEC)
    spec.update(changes)
    return {key: value for key, value in spec.items() if value is not None}


def test_fallback_bf16_is_422_unless_the_job_is_fp16(client: TestClient) -> None:
    response = client.post("/jobs", json=_spec(precision="bf16", loss_scale=None, on_divergence="fallback_bf16"))
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"][-1] == "on_divergence" and "fp16" in error["msg"]
    assert client.post("/jobs", json=_spec(on_divergence="bf16")).status_code == 422


def test_the_resource_shows_the_switches_and_the_effective_precision(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    job = client.post("/jobs", json=_spec(on_divergence="fallback_bf16")).json()
    assert (job["precision_switches"], job["effective_precision"]) == ([], "fp16")
    assert job["spec"]["on_divergence"] == "fallback_bf16"
    with sessions() as session:
        session.execute(update(Job).where(Job.id == job["id"]).values(precision_switches=[SWITCH]))
        session.commit()
    shown = client.get(f"/jobs/{job['id']}").json()
    assert shown["precision_switches"] == [SWITCH] and shown["effective_precision"] == "bf16"
    assert shown["spec"]["precision"] == "fp16"  # what the user asked stays as asked
    listed = client.get("/jobs").json()["jobs"]
    assert [j["effective_precision"] for j in listed if j["id"] == job["id"]] == ["bf16"]


def _stream(snapshots: list[Snapshot]) -> tuple[list[tuple[str, str | None]], list[int]]:
    """Drive the event stream over scripted snapshots; return its (event, id) pairs and each poll's ``after_step``."""
    polls: list[int] = []

    async def poll(_job_id: str, after: int, _known: str | None) -> Snapshot:
        polls.append(after)
        snap = snapshots[min(len(polls), len(snapshots)) - 1]
        records = [r for r in snap.records if record_step(r) > after]
        return Snapshot(snap.status, snap.step, None, snap.job, records, snap.has_cursor_record, snap.switches)

    async def collect() -> str:
        stats = StreamStats(EventStreamSettings(poll_interval_s=0.001))
        stream: AsyncIterator[str] = job_events("job", 0, poll, _never, stats)
        return "".join([chunk async for chunk in stream])

    text = anyio.run(collect)
    events = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if "event" in fields:
            events.append((fields["event"], fields.get("id")))
    return events, polls


async def _never() -> bool:
    return False


def _points(steps: range, precision: str = "fp16") -> list[dict[str, Any]]:
    return [{"step": s, "loss": 1.0, "precision": precision} for s in steps]


def test_the_event_stream_announces_a_switch_and_resends_the_rewound_steps() -> None:
    """The switch and the bf16 re-run of steps 9-11 land in one write: job.step 11 < 12, yet the rewind is to 8."""
    before = Snapshot("running", 12, None, {"status": "running"}, _points(range(1, 13)))
    after = Snapshot(
        "running",
        11,
        None,
        None,
        _points(range(1, 9)) + _points(range(9, 12), "bf16"),
        has_cursor_record=False,
        switches=[SWITCH],
    )
    done = Snapshot("succeeded", 11, None, {"status": "succeeded"}, after.records, switches=[SWITCH])
    events, polls = _stream([before, after, done])
    steps = [event_id for kind, event_id in events if kind == "step"]
    assert ("precision_switch", None) in events and ("rewind", "8") in events
    assert steps == [str(s) for s in range(1, 13)] + ["9", "10", "11"]
    assert polls[:3] == [0, 12, 8]
