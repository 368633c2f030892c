"""The digits example end to end: POST → database → Celery → torchrun → fp16 with dynamic loss scaling.

Run on the embedded stack (SQLite + filesystem broker) and on Postgres + Redis.
Logs the time from POST to the first step record, the time to ``succeeded`` and
the steps per second (``pytest -o log_cli=true -o log_cli_level=INFO`` shows them).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import pytest
from e2e_support import Stack, load_example

log = logging.getLogger("e2e.digits")

STATUS_ORDER = ["queued", "starting", "running", "succeeded"]
PHASE_ORDER = ["launching", "loading data", "building model", "first step"]
STARTUP_TIMES = ("launch_s", "imports_s", "data_s", "model_s", "first_step_s")
INIT_SCALE = 2.0**24


@dataclass
class Observed:
    """What polling saw while the job ran."""

    statuses: list[str]
    #: The resource's start-up ``phase`` values, in the order seen (each once).
    phases: list[str]
    first_step_s: float
    succeeded_s: float
    loss_scale_exported: bool
    job: dict[str, Any]


def _watch(stack: Stack, spec: dict[str, Any]) -> Observed:
    started = time.monotonic()
    job = stack.submit(spec)
    statuses, phases, first_step_s, exported = [job["status"]], [], None, False
    deadline = started + 600
    while job["status"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, f"stuck at {job['status']}:\n{stack.log_tail('worker')}"
        time.sleep(0.05)
        job = stack.job(job["id"])
        if job["status"] != statuses[-1]:
            statuses.append(job["status"])
        if job["phase"] and job["phase"] not in phases:
            phases.append(job["phase"])
        if first_step_s is None and job["step"] >= 1:
            first_step_s = time.monotonic() - started
        if job["status"] == "running" and not exported:
            exported = f'halfcast_loss_scale{{job_id="{job["id"]}"}}' in stack.client.get("/metrics").text
    assert job["status"] == "succeeded", f"{job['error']}\n{stack.log_tail('worker')}"
    return Observed(statuses, phases, first_step_s or float("nan"), time.monotonic() - started, exported, job)


def check_digits_fp16(stack: Stack, layout: str) -> None:
    """Run examples/digits-fp16.json and check the job resource, the metrics pages and /metrics."""
    spec = load_example("digits-fp16.json")
    assert spec["precision"] == "fp16" and spec["loss_scale"]["init_scale"] == INIT_SCALE
    seen = _watch(stack, spec)
    job, max_steps = seen.job, spec["max_steps"]
    assert seen.statuses == STATUS_ORDER, seen.statuses
    assert seen.loss_scale_exported, "GET /metrics never showed halfcast_loss_scale for the running job"
    assert seen.phases[0] == "launching" and set(seen.phases) <= set(PHASE_ORDER), seen.phases
    assert seen.phases == sorted(seen.phases, key=PHASE_ORDER.index)  # polls may miss a short phase, never reorder
    startup = job["startup"]  # timed through deathsig, torchrun and the rank wrapper: launch and imports too
    assert job["phase"] is None and all(isinstance(startup[name], float) for name in STARTUP_TIMES), startup
    assert job["step"] == max_steps and job["error"] is None and job["world_size"] == 1
    latest = job["latest"]
    for key in ("loss", "loss_scale", "skipped_steps", "samples_per_second", "grad_norm", "lr"):
        assert latest[key] is not None, key
    assert latest["skipped_steps"] > 0 and latest["loss_scale"] < INIT_SCALE
    assert job["eval"]["accuracy"] >= 0.90, job["eval"]
    evals = stack.client.get(f"/jobs/{job['id']}/evals").json()["evals"]
    assert [e["step"] for e in evals] == list(range(spec["eval_interval"], max_steps + 1, spec["eval_interval"]))
    assert evals[-1] == job["eval"]  # the validation curve ends with the job's newest evaluation
    points = stack.metric_points(job["id"], limit=64)
    assert [point["step"] for point in points] == list(range(1, max_steps + 1))
    assert points[0]["overflow"] is True and points[0]["loss_scale"] == INIT_SCALE
    assert points[-1]["skipped_steps"] == latest["skipped_steps"]
    span = points[-1]["time"] - points[0]["time"]
    trainer_rate = (max_steps - 1) / span if span > 0 else float("inf")
    observed_rate = max_steps / (seen.succeeded_s - seen.first_step_s)
    log.info(
        "digits-fp16 [%s]: POST→first step record %.2f s (start-up %s), POST→succeeded %.2f s; %.0f steps/s in the trainer "
        "(step record times), %.0f steps/s as seen by the client (first step → succeeded); "
        "%d steps, %d skipped, final loss scale %g, eval accuracy %.3f",
        layout,
        seen.first_step_s,
        startup,
        seen.succeeded_s,
        trainer_rate,
        observed_rate,
        max_steps,
        latest["skipped_steps"],
        latest["loss_scale"],
        job["eval"]["accuracy"],
    )


@pytest.mark.e2e
def test_digits_fp16_embedded(embedded_stack: Stack) -> None:
    """SQLite + filesystem broker: the README's `halfcast up` layout."""
    check_digits_fp16(embedded_stack, "embedded")


@pytest.mark.e2e
@pytest.mark.postgres
@pytest.mark.redis
def test_digits_fp16_postgres_redis(services_stack: Stack) -> None:
    """Postgres (schema from the migrations) + Redis broker."""
    check_digits_fp16(services_stack, "postgres+redis")
