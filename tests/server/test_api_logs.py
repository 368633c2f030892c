"""``GET /jobs/{id}/logs``: the last lines of a rank's log per attempt, and its errors (both backends)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from api_support import insert_job
from fastapi.testclient import TestClient
from live_server import set_status
from sqlalchemy.orm import Session, sessionmaker

from halfcast.contracts.rundir import JobRuns
from halfcast.core.settings import Settings


def write_log(settings: Settings, job_id: str, attempt: int, rank: int, text: str) -> Path:
    """Write ``text`` as ``rank``'s log of ``attempt`` where the worker would."""
    path = JobRuns.of(settings.runs_dir, job_id).attempt(attempt).rank_log(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _two_rank_job(sessions: sessionmaker[Session], settings: Settings, status: str = "running") -> str:
    """A 2-rank job on its second attempt, both attempts with logs for both ranks."""
    job_id = insert_job(sessions, status=status)
    set_status(sessions, job_id, status, world_size=2, attempt=2)
    for attempt in (1, 2):
        for rank in (0, 1):
            lines = "".join(f"a{attempt} r{rank} line {i}\n" for i in range(300))
            write_log(settings, job_id, attempt, rank, lines)
    return job_id


def test_default_is_the_newest_attempt_rank_0_last_200_lines(
    client: TestClient, sessions: sessionmaker[Session], settings: Settings
) -> None:
    job_id = _two_rank_job(sessions, settings)
    response = client.get(f"/jobs/{job_id}/logs")
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    body = response.json()
    assert (body["job_id"], body["attempt"], body["rank"]) == (job_id, 2, 0)
    assert body["lines"] == [f"a2 r0 line {i}" for i in range(100, 300)]


def test_rank_attempt_and_tail_select_the_lines(
    client: TestClient, sessions: sessionmaker[Session], settings: Settings
) -> None:
    job_id = _two_rank_job(sessions, settings)
    body = client.get(f"/jobs/{job_id}/logs", params={"rank": 1, "tail": 3, "attempt": 1}).json()
    assert (body["attempt"], body["rank"], body["lines"]) == (
        1,
        1,
        ["a1 r1 line 297", "a1 r1 line 298", "a1 r1 line 299"],
    )
    assert client.get(f"/jobs/{job_id}/logs", params={"tail": 0}).json()["lines"] == []
    assert len(client.get(f"/jobs/{job_id}/logs", params={"tail": 10000}).json()["lines"]) == 300


def test_a_partial_last_line_is_included(
    client: TestClient, sessions: sessionmaker[Session], settings: Settings
) -> None:
    job_id = insert_job(sessions, status="running")
    write_log(settings, job_id, 1, 0, "done\nhalf a li")
    assert client.get(f"/jobs/{job_id}/logs").json()["lines"] == ["done", "half a li"]


def test_a_rank_that_wrote_nothing_yet_has_no_lines(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions, status="starting")
    assert client.get(f"/jobs/{job_id}/logs").json() == {"job_id": job_id, "attempt": 1, "rank": 0, "lines": []}


def _error_loc(response: Any) -> list[object]:  # a TestClient response
    assert response.status_code == 422, response.text
    return [error["loc"] for error in response.json()["detail"]]


def test_bad_parameters_are_422_naming_them(
    client: TestClient, sessions: sessionmaker[Session], settings: Settings
) -> None:
    job_id = _two_rank_job(sessions, settings)
    url = f"/jobs/{job_id}/logs"
    assert _error_loc(client.get(url, params={"rank": -1})) == [["query", "rank"]]
    assert _error_loc(client.get(url, params={"tail": 10001})) == [["query", "tail"]]
    assert _error_loc(client.get(url, params={"tail": -1})) == [["query", "tail"]]
    assert _error_loc(client.get(url, params={"attempt": 0})) == [["query", "attempt"]]
    assert _error_loc(client.get(url, params={"rank": 2})) == [["query", "rank"]]  # world size 2
    assert _error_loc(client.get(url, params={"attempt": 3})) == [["query", "attempt"]]  # 2 attempts so far
    assert "world size 2" in client.get(url, params={"rank": 2}).json()["detail"][0]["msg"]


def test_unknown_job_404_queued_job_409_never_started_job_404(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    response = client.get("/jobs/nope/logs")
    assert response.status_code == 404 and response.json() == {"detail": "job nope not found", "job_id": "nope"}
    queued = insert_job(sessions, status="queued")
    response = client.get(f"/jobs/{queued}/logs")
    assert response.status_code == 409 and response.json()["detail"] == f"job {queued} has no logs yet: it is queued"
    set_status(sessions, queued, "cancelled")
    response = client.get(f"/jobs/{queued}/logs")
    assert response.status_code == 404 and "never started" in response.json()["detail"]
