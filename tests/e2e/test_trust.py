"""Issue 24, "Trust on a network": the attacks, replayed on PostgreSQL + Redis (``services_stack``).

Item 1: owner B cannot train from owner A's checkpoint, by job id or by a path into A's run
directory, nor name a server path; and no failure message shows a server path.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from e2e_support import Stack, load_example

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def alice(services_stack: Stack) -> Iterator[httpx.Client]:
    with services_stack.client_for("alice") as client:
        yield client


@pytest.fixture(scope="module")
def bob(services_stack: Stack) -> Iterator[httpx.Client]:
    with services_stack.client_for("bob") as client:
        yield client


@pytest.fixture(scope="module")
def alices_job(services_stack: Stack, alice: httpx.Client) -> str:
    """A finished job of alice's (6 steps): its ``final.pt`` is what bob wants."""
    response = alice.post("/jobs", json=load_example("synthetic-fp16.json", max_steps=6))
    assert response.status_code == 201, response.text
    job = services_stack.wait_terminal(response.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    return str(job["id"])


def _refused_at_resume_from(client: httpx.Client, resume_from: str) -> str:
    response = client.post("/jobs", json=load_example("synthetic-fp16.json", max_steps=7, resume_from=resume_from))
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "resume_from"], error
    return str(error["msg"])


def test_another_owner_cannot_resume_from_a_job_by_id_or_by_path(
    services_stack: Stack, bob: httpx.Client, alices_job: str
) -> None:
    by_id = _refused_at_resume_from(bob, alices_job)
    by_path = _refused_at_resume_from(bob, f"{alices_job}/attempt-1/checkpoints/final.pt")
    missing_id = "00000000-0000-4000-8000-000000000000"
    missing = _refused_at_resume_from(bob, missing_id)
    assert by_id.replace(alices_job, "ID") == by_path.replace(alices_job, "ID") == missing.replace(missing_id, "ID")
    assert bob.get("/jobs").json()["jobs"] == []  # nothing of bob's was stored
    assert bob.get(f"/jobs/{alices_job}/exports").status_code == 404


@pytest.mark.parametrize("resume_from", ["/etc/passwd", "../../../../etc/passwd"])
def test_a_server_path_is_refused_at_submission(alice: httpx.Client, resume_from: str) -> None:
    assert "job id" in _refused_at_resume_from(alice, resume_from)


def test_a_failure_message_shows_no_server_path(services_stack: Stack, alice: httpx.Client, alices_job: str) -> None:
    """Resuming a finished 6-step checkpoint with ``max_steps`` 6 fails ``spec_invalid``; the message names the
    checkpoint run-relative, never under the server's data directory."""
    reference = f"{alices_job}/attempt-1/checkpoints/final.pt"
    response = alice.post("/jobs", json=load_example("synthetic-fp16.json", max_steps=6, resume_from=reference))
    assert response.status_code == 201, response.text
    job = services_stack.wait_terminal(response.json()["id"])
    assert (job["status"], job["error"]["reason"]) == ("failed", "spec_invalid"), job["error"]
    message = job["error"]["message"]
    assert reference in message and str(services_stack.data_dir) not in message, message
