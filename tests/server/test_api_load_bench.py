"""Smoke test of ``bench.api_load`` (issue 11): a tiny run on PostgreSQL, checked for structure, not speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.api_load import main
from bench.load_clients import Tally, percentile, retry_delay, summary

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_a_tiny_load_run_answers_every_poll_and_cleans_up(postgres_url: str, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    argv = [
        "--clients",
        "3",
        "--duration",
        "1.5",
        "--warmup",
        "0.5",
        "--jobs",
        "2",
        "--running",
        "1",
        "--probe-interval",
        "0.5",
        "--admin-url",
        postgres_url,
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert [(r["scenario"]["clients"], r["scenario"]["mode"]) for r in result["results"]] == [
        (3, "plain"),
        (3, "conditional"),
    ]
    for run in result["results"]:
        assert run["polls"]["requests"] > 0 and run["polls"]["errors"] == {}
        assert run["probe"]["cancel"]["outcomes"].get("ok", 0) >= 1 and run["probe"]["healthz"]["errors"] == {}
    assert sum(result["writer"]["steps"].values()) > 0


def test_the_training_mode_polls_real_training_jobs_and_says_what_polling_cost_them(
    postgres_url: str, tmp_path: Path
) -> None:
    """Issue 31 item 2: ``--training 1`` adds rows polled while a real worker trains a job, with its quiet and polled rates.

    About 30 s alone, up to 65 s beside other workers: two stacks (the simulated one, then an API with a real worker
    and a training job), each measured for a quiet window and a polled one.
    """
    out = tmp_path / "load.json"
    argv = ["--clients", "2", "--modes", "plain", "--duration", "2", "--warmup", "0.5", "--jobs", "1", "--running", "1"]
    argv += ["--training", "1", "--probe-interval", "1", "--admin-url", postgres_url, "--json", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert [run["load"] for run in result["results"]] == ["simulated", "1 training job"]
    training = result["results"][1]
    assert training["polls"]["requests"] > 0 and training["polls"]["errors"] == {}
    assert training["training_steps_per_s"]["quiet"] > 0 and training["training_steps_per_s"]["polled"] > 0
    assert training["training"]["polled"]["seconds"] >= 2 and training["training"]["quiet_after"]["seconds"] >= 2
    for window in ("quiet", "polled"):
        cores = training["cpu_cores_by_role"][window]
        assert cores["runs"] > 0.1, f"the training run used no CPU in the {window} window: {cores}"
    polled = training["cpu_cores_by_role"]["polled"]  # a quiet window's API may use less than a clock tick
    assert polled["api"] > 0 and polled["load generator"] > 0, polled


def test_percentiles_and_summary() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0 and percentile([1.0, 2.0, 3.0, 4.0], 0.99) == 4.0
    tally = Tally()
    for seconds, outcome in ((0.01, "ok"), (0.02, "not_modified"), (10.0, "timeout"), (0.001, "503")):
        tally.add(seconds, outcome)
    result = summary(tally, duration_s=2.0)
    assert result["requests"] == 4 and result["answers_per_s"] == 1.0
    assert result["errors"] == {"timeout": 1, "503": 1} and result["max_ms"] == 10_000.0


def test_pollers_wait_what_a_503_asks() -> None:
    assert retry_delay({"retry-after": "2"}) == 2.0 and retry_delay({}) == 1.0
    assert retry_delay({"retry-after": "soon"}) == 1.0 and retry_delay({"retry-after": "600"}) == 10.0
