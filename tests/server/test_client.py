"""``halfcast.client.HalfcastClient`` against a live API (uvicorn in a thread, SQLite)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_support import VALID_SPEC, FakeQueue, insert_job, insert_steps
from live_server import LiveServer, add_steps, free_port, set_status, sqlite_copy, step_record
from sqlalchemy.orm import Session, sessionmaker

from halfcast.client import (
    Conflict,
    FieldError,
    HalfcastClient,
    HalfcastError,
    NotFound,
    ServerUnavailable,
    ValidationFailed,
    parse_sse,
)
from halfcast.common.strict_json import NONFINITE_MESSAGE
from halfcast.contracts.records import EvalRecord as EvalLine
from halfcast.contracts.records import StepRecord
from halfcast.contracts.resources import JobPublic
from halfcast.contracts.spec import JobSpec
from halfcast.contracts.status import JobStatus
from halfcast.core.db.models import EvalRow
from halfcast.core.settings import Settings
from server.app import create_app
from server.streams.stats import EventStreamSettings, StreamStats


@pytest.fixture
def database_url(data_dir: Path, sqlite_template: Path) -> str:
    """SQLite only: the client's behaviour does not depend on the database (the API tests cover both)."""
    return sqlite_copy(data_dir, sqlite_template)


@pytest.fixture
def queue() -> FakeQueue:
    return FakeQueue()


@pytest.fixture
def server(settings: Settings, queue: FakeQueue) -> Iterator[LiveServer]:
    app = create_app(settings, queue)
    app.state.event_streams = StreamStats(EventStreamSettings(poll_interval_s=0.05))
    with LiveServer(app) as live:
        yield live


@pytest.fixture
def halfcast(server: LiveServer, admin_token: str) -> Iterator[HalfcastClient]:
    with HalfcastClient(server.url, timeout=10, token=admin_token) as client:
        yield client


def test_submit_get_and_cancel(halfcast: HalfcastClient, queue: FakeQueue) -> None:
    job = halfcast.submit(VALID_SPEC)
    assert isinstance(job, JobPublic) and job.status == JobStatus.QUEUED and queue.sent == [job.id]
    assert halfcast.get(job.id).spec["precision"] == "fp16"
    assert halfcast.cancel(job.id).status == "cancelled"
    with pytest.raises(Conflict, match="already cancelled"):
        halfcast.cancel(job.id)
    again = halfcast.submit(VALID_SPEC, idempotency_key="k-1")
    assert halfcast.submit(VALID_SPEC, idempotency_key="k-1").id == again.id


def test_a_typed_spec_is_submitted_as_written_and_read_back_typed(halfcast: HalfcastClient) -> None:
    typed = JobSpec.model_validate(VALID_SPEC)
    job = halfcast.submit(typed)
    assert job.spec == halfcast.submit(VALID_SPEC).spec  # stored as the same spec sent as a mapping
    assert isinstance(job.job_spec(), JobSpec) and job.job_spec() == typed
    assert job.job_spec().effective_loss_scale == typed.effective_loss_scale


def test_get_asks_again_with_the_etag_and_reuses_its_copy_on_304(
    halfcast: HalfcastClient, server: LiveServer, sessions: sessionmaker[Session]
) -> None:
    statuses: list[int] = []
    halfcast._http.event_hooks["response"].append(lambda response: statuses.append(response.status_code))
    job_id = insert_job(sessions, status="running")
    first = halfcast.get(job_id)
    first.status, first.spec["precision"] = JobStatus.FAILED, "mutated by the caller"  # the copy kept is not handed out
    again = halfcast.get(job_id)
    assert (again.status, again.spec["precision"]) == ("running", "fp16") and statuses == [200, 304]
    add_steps(sessions, job_id, [step_record(1)])
    assert halfcast.get(job_id).step == 1 and statuses == [200, 304, 200]
    latest = halfcast.get(job_id).latest
    assert latest is not None and latest.step == 1 and statuses[-1] == 304


def test_an_answer_that_is_not_the_model_is_a_halfcast_error() -> None:
    """A job resource without its fields (a proxy's page, a broken server) is a typed error, not a KeyError later."""
    client = HalfcastClient("http://halfcast.test")
    client._http = httpx.Client(
        base_url=client.url, transport=httpx.MockTransport(lambda _: httpx.Response(200, json={"id": "j"}))
    )
    with client, pytest.raises(HalfcastError, match="JobPublic that does not validate"):
        client.get("j")


def test_a_bad_spec_raises_validation_failed_with_every_field(halfcast: HalfcastClient, queue: FakeQueue) -> None:
    spec = {
        **VALID_SPEC,
        "micro_batch_size": 0,
        "bogus": 1,
        "model": {"name": "mlp", "config": {"hidden_sizes": ["x"]}},
    }
    with pytest.raises(ValidationFailed) as caught:
        halfcast.submit(spec)
    paths = {error.path for error in caught.value.errors}
    assert {"micro_batch_size", "bogus", "model.config.hidden_sizes[0]"} <= paths, paths  # no "mlp" union tag
    assert caught.value.status_code == 422 and queue.sent == []
    assert all(error.msg for error in caught.value.errors)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_a_nonfinite_float_is_validation_failed_and_never_sent(value: float) -> None:
    """json= in httpx raised ValueError (a traceback in the CLI); the server is not even asked (none listens here)."""
    spec = {**VALID_SPEC, "model": {"name": "mlp", "config": {"hidden_sizes": [64, value]}}}
    with (
        HalfcastClient(f"http://127.0.0.1:{free_port()}", timeout=2) as client,
        pytest.raises(ValidationFailed) as caught,
    ):
        client.submit(spec)
    assert [(e.path, e.type) for e in caught.value.errors] == [("model.config.hidden_sizes[1]", "json_invalid")]
    assert caught.value.errors[0].msg == NONFINITE_MESSAGE


def test_a_raw_nan_body_gets_its_422_from_a_real_server(server: LiveServer, admin_token: str, queue: FakeQueue) -> None:
    """Over uvicorn the NaN body answered 500 (the 422 could not be rendered); a client sending raw text gets the 422."""
    body = json.dumps(VALID_SPEC).replace('"max_steps": 50', '"max_steps": NaN')
    response = httpx.post(
        f"{server.url}/jobs",
        content=body,
        timeout=10,
        headers={"Authorization": f"Bearer {admin_token}", "content-type": "application/json"},
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "max_steps"] and queue.sent == []


def test_field_paths() -> None:
    assert FieldError(("body", "loss_scale", "init_scale"), "m").path == "loss_scale.init_scale"
    assert FieldError(("body", "model", "config", "hidden_sizes", 0), "m").path == "model.config.hidden_sizes[0]"
    assert FieldError(("body",), "m").path == "(spec)"
    assert FieldError(("query", "cursor"), "m").path == "query.cursor"
    assert FieldError(("body", "model", "mlp", "config"), "m", field=("model", "config")).path == "model.config"


def test_unknown_job_is_not_found(halfcast: HalfcastClient) -> None:
    with pytest.raises(NotFound, match="not found"):
        halfcast.get("nope")
    with pytest.raises(NotFound):
        next(halfcast.events("nope"))


def test_list_pages_and_metrics_pages(halfcast: HalfcastClient, sessions: sessionmaker[Session]) -> None:
    ids = [insert_job(sessions, seconds=n) for n in range(5)]
    assert [job.id for job in halfcast.list(limit=3)] == ids[::-1][:3]
    assert [job.id for job in halfcast.jobs(page_size=2)] == ids[::-1]
    assert halfcast.list(status="running") == []
    insert_steps(sessions, ids[0], range(1, 8))
    pages = list(halfcast.metrics(ids[0], page_size=3))
    assert [[point.step for point in page] for page in pages] == [[1, 2, 3], [4, 5, 6], [7]]
    assert [point.step for page in halfcast.metrics(ids[0], after_step=5) for point in page] == [6, 7]
    point = pages[0][2]
    assert isinstance(point, StepRecord) and (point.overflow, point.grad_norm, point.skipped_steps) == (True, None, 1)


def test_evals_are_the_jobs_validation_curve_in_step_order(
    halfcast: HalfcastClient, sessions: sessionmaker[Session]
) -> None:
    job_id = insert_job(sessions, status="running")
    assert halfcast.evals(job_id) == []
    evaluations = [{"step": step, "time": float(step), "loss": 1.0 / step, "accuracy": step / 10} for step in (6, 3, 9)]
    with sessions() as session:
        session.add_all(EvalRow(job_id=job_id, step=e["step"], time=e["time"], data=e) for e in evaluations)
        session.commit()
    found = halfcast.evals(job_id)
    assert [e.step for e in found] == [3, 6, 9] and all(isinstance(e, EvalLine) for e in found)
    assert (found[0].loss, found[0].accuracy, found[0].perplexity) == (1 / 3, 0.3, None)
    with pytest.raises(NotFound):
        halfcast.evals("no-such-job")


def test_events_follow_a_job_to_its_end(halfcast: HalfcastClient, sessions: sessionmaker[Session]) -> None:
    """Steps 1-2 are there before the stream opens; 3-5 and the end are written once its first event came (the
    writer used to start at once: under load steps 3-5 could precede the stream's opening status event)."""
    job_id = insert_job(sessions, status="running")
    add_steps(sessions, job_id, [step_record(1), step_record(2)])
    streaming = threading.Event()

    def work() -> None:
        assert streaming.wait(30), "the stream never opened"
        for step in range(3, 6):
            add_steps(sessions, job_id, [step_record(step)])
            time.sleep(0.02)
        set_status(sessions, job_id, "failed", error_reason="nonfinite_loss", error_message="loss was NaN")

    writer = threading.Thread(target=work)
    writer.start()
    events = []
    for event in halfcast.events(job_id, after_step=2):
        events.append(event)
        streaming.set()
    writer.join()
    assert [(e.event, e.id) for e in events if e.event == "step"] == [("step", "3"), ("step", "4"), ("step", "5")]
    last = events[-1].data
    assert isinstance(events[0].data, JobPublic) and isinstance(last, JobPublic)
    assert last.error is not None and last.error.reason == "nonfinite_loss"


def test_a_server_that_is_down_raises_server_unavailable() -> None:
    with HalfcastClient(f"http://127.0.0.1:{free_port()}", timeout=2) as client:
        with pytest.raises(ServerUnavailable, match="cannot reach"):
            client.list()
        with pytest.raises(ServerUnavailable):
            list(client.events("x", reconnects=0))


def test_a_broker_outage_is_server_unavailable(halfcast: HalfcastClient, queue: FakeQueue) -> None:
    queue.error = ConnectionError("broker down")
    with pytest.raises(ServerUnavailable, match="could not be queued") as caught:
        halfcast.submit(VALID_SPEC)
    assert caught.value.status_code == 503


def test_parse_sse_joins_multi_line_data_and_skips_comments() -> None:
    lines: list[Any] = [": hi", "retry: 10", "event: step", "id: 4", 'data: {"a":', "data: 1}", "", ""]
    events = list(parse_sse(iter(lines)))
    assert [(e.event, e.id, e.data) for e in events] == [("step", "4", {"a": 1})]
