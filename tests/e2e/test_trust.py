"""Issue 24, "Trust on a network": the attacks, replayed on PostgreSQL + Redis (``services_stack``).

Item 1: owner B cannot train from owner A's checkpoint, by job id or by a path into A's run
directory, nor name a server path; and no failure message shows a server path. Item 6: a 2-node
job forms on workers of 2 slots each.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from e2e_support import Stack, load_example

from bench.trust_workers import TWO_NODE_SPEC
from conftest import make_stack

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


# ----------------------------------------------------------------------------- item 6: two slots per worker


@pytest.fixture(scope="module")
def two_slot_workers(tmp_path_factory: pytest.TempPathFactory, postgres_url: str, redis_url: str) -> Iterator[Stack]:
    """Two workers of 2 slots each (the default of ``halfcast up`` and ``halfcast worker``) on PostgreSQL + Redis."""
    yield from make_stack(
        tmp_path_factory.mktemp("two-slots"),
        workers=2,
        database_url=postgres_url,
        broker_url=redis_url,
        worker_concurrency="2",
        worker_host_address="127.0.0.1",
    )


def test_a_two_node_job_forms_when_node_0s_worker_has_two_slots(two_slot_workers: Stack) -> None:
    """Node 0's own second slot took the join message it sent, declined it and dropped it: the job stayed
    ``gathering`` until ``gang_timeout_s`` (600 s). Now the message goes back to the queue for the other worker."""
    two_slot_workers.kill_worker("worker-2")  # node 0's worker alone: its second slot surely takes the join message
    job = two_slot_workers.submit(TWO_NODE_SPEC)
    two_slot_workers.wait(job["id"], lambda j: j["status"] == "gathering", timeout_s=60)
    time.sleep(3)  # the message has reached node 0's own second slot by now (and was dropped, before the fix)
    assert two_slot_workers.job(job["id"])["status"] == "gathering"
    two_slot_workers.restart_worker("worker-2")
    formed = two_slot_workers.wait(job["id"], lambda j: j["status"] not in ("queued", "gathering"), timeout_s=60)
    assert formed["status"] in ("starting", "running", "succeeded"), formed
    job = two_slot_workers.wait_terminal(job["id"], timeout_s=180)
    assert (job["status"], job["attempt"]) == ("succeeded", 1), job["error"]
    assert sorted(member["node_rank"] for member in job["members"]) == [0, 1]
