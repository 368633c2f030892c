"""The API's resources are the contracts models: the routes answer them, their JSON is the stored JSON, and the
event streams' payloads validate as the models :mod:`halfcast.contracts.events` names (what the client reads them as)."""

from __future__ import annotations

import ast
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from halfcast.contracts import access, artifacts, registry, resources
from halfcast.contracts.events import JOB_EVENTS, LOG_EVENTS, LogChunk, Rewind
from halfcast.contracts.records import StartupTimes, StepRecord
from halfcast.contracts.rundir import JobRuns
from halfcast.contracts.stored import StoredEval, StoredStep, StoredSwitch
from halfcast.core.db.models import Job
from halfcast.sse import Event, parse_sse, typed_events
from server.routes import audit, checkpoints, datasets, exports, job_resource, models, session
from server.schemas import job_public
from server.streams.events import Snapshot, job_events
from server.streams.logstream import JobState, LogTarget, _LogFrames
from server.streams.stats import EventStreamSettings, StreamStats

ROOT = Path(__file__).resolve().parents[2]
#: A stored step record: keys in the database's order (jsonb sorts them), a field the client does not know,
#: fields an older trainer did not write absent, no ``type``.
LATEST = {"lr": 0.01, "loss": 0.5, "step": 3, "time": 12.5, "extra": [1, 2], "loss_scale": 1024.0, "skipped_steps": 1}
EVAL: dict[str, object] = {"loss": 0.25, "step": 3, "time": 13.0, "accuracy": 0.75}
SWITCH = {
    "to": "bf16",
    "from": "fp16",
    "step": 3,
    "time": 14.0,
    "reason": "loss_scale_collapsed",
    "message": "collapsed",
    "rewound_to_step": 2,
}


def _job(**fields: Any) -> Job:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    base: dict[str, Any] = {
        "id": "j",
        "name": None,
        "owner": "o",
        "status": "running",
        "spec": {"precision": "fp16"},
        "created_at": now,
        "started_at": now,
        "finished_at": None,
        "error_reason": None,
        "error_message": None,
        "step": 3,
        "max_steps": 10,
        "world_size": 1,
        "latest": LATEST,
        "eval": EVAL,
        "attempt": 1,
        "precision_switches": [SWITCH],
        "end_info": None,
        "startup": None,
    }
    return Job(**(base | fields))


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def test_the_job_resource_types_its_records_and_serves_them_as_stored() -> None:
    resource = job_public(_job())
    assert isinstance(resource.latest, StoredStep) and isinstance(resource.latest, StepRecord)
    assert (resource.latest.step, resource.latest.loss, resource.latest.overflow) == (3, 0.5, None)
    assert isinstance(resource.eval, StoredEval) and resource.eval.accuracy == 0.75
    assert isinstance(resource.precision_switches[0], StoredSwitch) and resource.precision_switches[0].from_ == "fp16"
    text = resource.model_dump_json()  # what GET /jobs/{id} sends (and its ETag hashes)
    for key, stored in (("latest", LATEST), ("eval", EVAL), ("precision_switches", [SWITCH])):
        assert f'"{key}":{_compact(stored)}' in text
    assert json.loads(text) == resource.model_dump(mode="json")
    again = resources.JobPublic.model_validate_json(text)  # the client's copy serializes the same way
    assert again.model_dump_json() == text


def test_pages_serve_their_records_as_stored() -> None:
    page = resources.MetricsPage(job_id="j", points=[LATEST, {**LATEST, "step": 4}])
    assert page.model_dump_json() == _compact({"job_id": "j", "points": [LATEST, {**LATEST, "step": 4}]})
    assert resources.EvalList(job_id="j", evals=[EVAL]).model_dump_json() == _compact({"job_id": "j", "evals": [EVAL]})


@pytest.mark.parametrize(("router", "path", "model"), [
    (job_resource.router, "/jobs/{job_id}", resources.JobPublic),
    (checkpoints.router, "/jobs/{job_id}/checkpoints", artifacts.CheckpointList),
    (exports.router, "/jobs/{job_id}/exports", artifacts.ExportList),
    (datasets.router, "/datasets", registry.DatasetList),
    (datasets.router, "/datasets/{dataset_id}", registry.DatasetPublic),
    (models.router, "/models", registry.ModelList),
    (models.router, "/models/{model_id}", registry.ModelPublic),
    (session.router, "/session", access.SessionPublic),
    (audit.router, "/audit", access.AuditList),
])  # fmt: skip  # a case table: route, path, model a row
def test_the_routes_answer_the_contracts_models(router: Any, path: str, model: type) -> None:
    answered = {route.response_model for route in router.routes if route.path == path and "GET" in route.methods}
    assert answered == {model}


async def _no() -> bool:
    return False


def _job_stream(snapshots: list[Snapshot]) -> str:
    stats = StreamStats(EventStreamSettings(poll_interval_s=0.001))

    async def poll(_job_id: str, _after: int, _known: str | None) -> Snapshot:
        return snapshots.pop(0) if len(snapshots) > 1 else snapshots[0]

    async def collect() -> str:
        stream: AsyncIterator[str] = job_events("j", 0, poll, _no, stats)
        return "".join([chunk async for chunk in stream])

    return anyio.run(collect)


def test_the_job_streams_payloads_are_the_models_of_their_names() -> None:
    running = job_public(_job(precision_switches=[])).model_dump(mode="json")
    done = job_public(_job(status="succeeded", step=4)).model_dump(mode="json")
    points = [{**LATEST, "step": 2}, {**LATEST, "step": 4}]
    snapshots = [
        Snapshot("running", 4, EVAL, running, points, switches=[]),
        Snapshot("succeeded", 2, EVAL, done, [], switches=[SWITCH]),  # a switch rewound to step 2
    ]
    raw = list(parse_sse(iter(_job_stream(snapshots).split("\n"))))
    assert {event.event for event in raw} == {"status", "step", "eval", "precision_switch", "rewind"} <= set(JOB_EVENTS)
    typed = list(typed_events(iter(raw), JOB_EVENTS))
    assert [type(event.data) for event in typed] == [JOB_EVENTS[event.event] for event in raw]
    assert [e.data.model_dump(mode="json") for e in typed] == [e.data for e in raw]  # read back, the same JSON
    assert any(isinstance(event.data, Rewind) and event.data.step == 2 for event in typed)


def test_the_log_streams_payloads_are_the_models_of_their_names(tmp_path: Path) -> None:
    log = JobRuns.of(tmp_path, "j").attempt(1).rank_log(0)
    log.parent.mkdir(parents=True)
    log.write_text("one\ntwo\n")
    frames = _LogFrames(LogTarget("j", 0, tmp_path)).step(JobState("succeeded", 1))
    raw = list(parse_sse(iter("".join(frames).split("\n"))))
    assert [event.event for event in raw] == ["attempt", "lines", "end"]
    typed = list(typed_events(iter(raw), LOG_EVENTS))
    assert [type(event.data) for event in typed] == [LOG_EVENTS[event.event] for event in raw]
    assert isinstance(typed[1].data, LogChunk) and typed[1].data.lines == ["one", "two"]
    assert [e.data.model_dump(mode="json") for e in typed] == [e.data for e in raw]


def test_an_event_the_client_does_not_know_is_skipped() -> None:
    raw = [Event("news", None, {"a": 1}), Event("rewind", "3", {"step": 3})]
    assert [(e.event, e.data) for e in typed_events(iter(raw), JOB_EVENTS)] == [("rewind", Rewind(step=3))]


def test_startup_times_is_defined_once() -> None:
    from trainer import startup

    defined = [
        f"{path.relative_to(ROOT)}"
        for package in ("halfcast", "trainer", "worker", "server")
        for path in sorted((ROOT / package).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef) and node.name in ("StartupTimes", "StartupPublic")
    ]
    assert defined == ["halfcast/contracts/records.py"]
    assert startup.StartupTimes is StartupTimes
    assert resources.JobPublic.model_fields["startup"].annotation == StartupTimes | None
