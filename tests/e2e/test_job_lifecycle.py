"""Job lifecycle on the embedded stack: DDP, cancel, crash, and a precision the worker cannot run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from e2e_support import Stack, load_example, run_processes, session_alive

from halfcast.client import HalfcastClient
from trainer.export import load_trained_model

pytestmark = pytest.mark.e2e


def _synthetic(**overrides: object) -> dict[str, object]:
    return load_example("synthetic-fp16.json", **overrides)


def test_ddp_with_two_processes_succeeds(embedded_stack: Stack) -> None:
    """The digits example as 2 gloo ranks under torchrun (DDP)."""
    job = embedded_stack.submit(load_example("digits-fp16.json", processes=2))
    assert job["world_size"] == 2
    job = embedded_stack.wait_terminal(job["id"])
    assert job["status"] == "succeeded", job["error"]
    assert job["world_size"] == 2 and job["step"] == job["max_steps"]
    assert job["eval"] is not None and job["latest"]["skipped_steps"] > 0


def test_cancel_leaves_no_process_and_the_next_job_runs(embedded_stack: Stack) -> None:
    """C19-style: a 2-rank job running long is cancelled; nothing of it survives; a new job then runs."""
    spec = _synthetic(processes=2, max_steps=100_000, faults={"sleep_per_step_s": 0.2})
    job = embedded_stack.submit(spec)
    embedded_stack.wait(job["id"], lambda j: j["status"] == "running" and j["step"] >= 2, timeout_s=180)
    processes = run_processes(job["id"])
    sessions = {sid for _, sid in processes}
    assert len(processes) >= 3 and len(sessions) == 3, (
        processes
    )  # torchrun and its 2 ranks, each in a session of its own
    started = time.monotonic()
    response = embedded_stack.client.post(f"/jobs/{job['id']}/cancel")
    assert response.status_code in (200, 202), response.text
    job = embedded_stack.wait_terminal(job["id"], timeout_s=60)
    assert job["status"] == "cancelled", job
    assert job["error"] is None or job["error"]["reason"] not in ("rank_failed", "worker_error")
    assert time.monotonic() - started < 30
    assert run_processes(job["id"]) == []
    assert all(session_alive(sid) == [] for sid in sessions)
    follow_up = embedded_stack.submit(_synthetic(max_steps=10))
    assert embedded_stack.wait_terminal(follow_up["id"])["status"] == "succeeded"


def test_an_fp16_job_that_skipped_every_step_fails_no_update_applied(embedded_stack: Stack) -> None:
    """10 fp16 steps, each overflowing (far below max_consecutive_skips): failed, never succeeded, and the
    resource says why: 0 applied, 10 skipped."""
    job = embedded_stack.submit(_synthetic(max_steps=10, faults={"nonfinite_grad_from_step": 1}))
    job = embedded_stack.wait_terminal(job["id"])
    assert (job["status"], (job["error"] or {}).get("reason")) == ("failed", "no_update_applied"), job["error"]
    assert (job["step"], job["applied_steps"], job["skipped_steps"]) == (10, 0, 10)


def test_a_crashing_trainer_fails_with_rank_failed_and_the_error_tail(embedded_stack: Stack) -> None:
    job = embedded_stack.submit(_synthetic(max_steps=20, faults={"raise_at_step": 3}))
    job = embedded_stack.wait_terminal(job["id"])
    assert job["status"] == "failed"
    assert job["error"]["reason"] == "rank_failed"
    assert "raise_at_step 3" in job["error"]["message"]
    assert "Traceback" in job["error"]["message"]
    assert job["step"] == 2


def test_fp8_without_gpus_is_rejected_at_submission(embedded_stack: Stack) -> None:
    spec = _synthetic(precision="fp8", loss_scale=None)
    del spec["loss_scale"]
    response = embedded_stack.client.post("/jobs", json=spec)
    assert response.status_code == 422
    assert "precision" in response.text
    assert all(job["spec"]["precision"] != "fp8" for job in embedded_stack.client.get("/jobs").json()["jobs"])


def test_fp8_on_a_gpu_less_cluster_is_refused_at_submission(embedded_stack: Stack) -> None:
    """Never run as another precision: the registered worker has no GPU, so a GPU job is a 422 naming `gpus`."""
    done = embedded_stack.wait_terminal(embedded_stack.submit(_synthetic(max_steps=2))["id"])
    workers = embedded_stack.client.get("/workers").json()["workers"]
    assert [(w["gpus"], w["live"]) for w in workers] == [([], True)]  # registered on start, heartbeating
    assert workers[0]["id"] == done["attempts"][0]["worker_id"]  # the registry id is the lease owner id
    spec = _synthetic(precision="fp8", gpus=1, max_steps=10)
    del spec["loss_scale"]
    response = embedded_stack.client.post("/jobs", json=spec)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "gpus"]


def test_resume_from_a_finished_job_continues_its_trajectory(embedded_stack: Stack, tmp_path: Path) -> None:
    """A job resumed from another job's checkpoint starts at the next step with the saved loss scale.

    The finished job's trained weights download (``GET /jobs/{id}/checkpoints/final.pt``, the
    newest checkpoint, what ``resume_from`` takes) and load with ``torch.load(weights_only=True)``.
    """
    first = embedded_stack.wait_terminal(embedded_stack.submit(_synthetic(max_steps=12))["id"])
    assert first["status"] == "succeeded", first["error"]
    with HalfcastClient(str(embedded_stack.client.base_url), token=embedded_stack.token) as halfcast:
        saved = halfcast.download_checkpoint(first["id"], tmp_path)
    assert (saved.checkpoint.name, saved.checkpoint.step, saved.checkpoint.final) == ("final.pt", 12, True)
    checkpoint = torch.load(saved.path, map_location="cpu", weights_only=True)
    assert checkpoint["step"] == 12 and checkpoint["spec"]["max_steps"] == 12
    assert checkpoint["model"] and all(isinstance(t, torch.Tensor) for t in checkpoint["model"].values())
    model = load_trained_model(saved.path)  # the trained model itself, for inference
    assert all(torch.equal(model.state_dict()[k], v) for k, v in checkpoint["model"].items())
    spec = _synthetic(max_steps=20, resume_from=first["id"])
    second = embedded_stack.wait_terminal(embedded_stack.submit(spec)["id"])
    assert second["status"] == "succeeded", second["error"]
    points = embedded_stack.metric_points(second["id"])
    assert [p["step"] for p in points] == list(range(13, 21))
    assert points[0]["skipped_steps"] >= first["latest"]["skipped_steps"]

    missing = embedded_stack.client.post("/jobs", json=_synthetic(resume_from="no-such-job"))
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["body", "resume_from"], missing.text
