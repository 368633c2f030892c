"""Canary test (issue 6, item 6): service passwords never leave the processes that need them.

The real stack (API + worker + torchrun) runs on PostgreSQL and Redis with URLs whose
passwords are canaries (PostgreSQL here trusts any password; Redis without
``requirepass`` accepts AUTH with any password); the worker's environment also holds
canary tokens and passwords. A job succeeds, one fails, one is cancelled while
running. Then no canary may appear in any API answer, in any file under the data
directory (run directories, rank and launcher logs, spec.json, step records, and the
API's and the worker's own output, Celery's banner included), nor in the environment
of the run's processes.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import Stack, load_example, run_processes, stack_environment

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

DB_CANARY = f"CANARY-db-{uuid.uuid4().hex[:12]}"
BROKER_CANARY = f"CANARY-broker-{uuid.uuid4().hex[:12]}"
ENV_CANARY = f"CANARY-env-{uuid.uuid4().hex[:12]}"
CANARIES = (DB_CANARY, BROKER_CANARY, ENV_CANARY)
#: Variables of the worker's environment that must not reach a run (with the service URLs).
SECRET_ENV = {
    "PGPASSWORD": ENV_CANARY,
    "HALFCAST_EXTRA_TOKEN": ENV_CANARY,
    "AWS_SECRET_ACCESS_KEY": ENV_CANARY,
    "REDIS_URL": f"redis://:{ENV_CANARY}@127.0.0.1:6379/0",
}
SECRET_NAME = re.compile(r"_URL$|PASSWORD|TOKEN|SECRET", re.IGNORECASE)
VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _with_password(url: str, password: str) -> str:
    """``scheme://user@host...`` or ``scheme://host...`` with ``password`` added to its userinfo."""
    scheme, rest = url.split("://", 1)
    user, _, host = rest.rpartition("@")
    return f"{scheme}://{user}:{password}@{host}"


@pytest.fixture(scope="module")
def canary_stack(tmp_path_factory: pytest.TempPathFactory, postgres_url: str, redis_url: str) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp("secrets")
    env = stack_environment(
        data_dir,
        database_url=_with_password(postgres_url, DB_CANARY),
        broker_url=_with_password(redis_url, BROKER_CANARY),
    )
    env.update(SECRET_ENV)
    stack = Stack(data_dir, env).start()
    try:
        yield stack
    finally:
        stack.stop()


def _assert_clean(what: str, text: str) -> None:
    leaked = [canary for canary in CANARIES if canary in text]
    assert not leaked, f"{what} holds {leaked}"


def _spec(**overrides: object) -> dict[str, object]:
    return load_example("synthetic-fp16.json", **{"max_steps": 8, "checkpoint_interval": 4, **overrides})


def _run_environments(job_id: str) -> dict[int, dict[str, str]]:
    """The environment of every live process of the job's run (torchrun, the ranks).

    For a warm run (worker/warm/) that is the standby's environment as it was started (a fork's
    ``os.environ`` changes do not show there): built like a cold run's, it holds no secret either.
    """
    found = {}
    for pid, _ in run_processes(job_id):
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        pairs = (item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        # a process title set with setproctitle (a warm rank names its job) may overwrite the start of the
        # environment block: what it leaves is no variable ("ir /tmp/.../secrets0/runs/... MASTER_PORT")
        found[pid] = {name: value for name, value in pairs if VARIABLE_NAME.fullmatch(name)}
    return found


def _api_answers(stack: Stack, job_ids: list[str]) -> Iterator[tuple[str, str]]:
    paths = ["/jobs", "/workers", "/readyz", "/healthz", "/metrics", "/audit", "/session", "/openapi.json"]
    for job_id in job_ids:
        paths += [
            f"/jobs/{job_id}",
            f"/jobs/{job_id}/metrics",
            f"/jobs/{job_id}/logs?tail=1000",
            f"/jobs/{job_id}/events",
        ]
    for path in paths:
        response = stack.client.get(path)
        assert response.status_code < 500 or path == "/readyz", (path, response.text)
        yield path, response.text


def test_no_canary_leaks_anywhere(canary_stack: Stack) -> None:
    stack = canary_stack
    # the canaries are in use (the stack's own environment: Celery's process title, through setproctitle, may
    # overwrite what /proc/<pid>/environ shows of the worker's)
    assert DB_CANARY in repr(stack.env) and BROKER_CANARY in repr(stack.env)

    done = stack.wait_terminal(stack.submit(_spec())["id"])
    assert done["status"] == "succeeded", done["error"]
    failed = stack.wait_terminal(stack.submit(_spec(faults={"raise_at_step": 3}))["id"])
    assert failed["status"] == "failed" and failed["error"]["reason"] == "rank_failed"
    running = stack.submit(_spec(max_steps=100_000, faults={"sleep_per_step_s": 0.2}))
    stack.wait(running["id"], lambda job: job["status"] == "running" and job["step"] >= 1, timeout_s=180)
    environments = _run_environments(running["id"])
    assert environments, "no process of the running job was found"
    for pid, env in environments.items():
        _assert_clean(f"the environment of run process {pid}", repr(env))
        assert [name for name in env if SECRET_NAME.search(name)] == [], (pid, sorted(env))
    assert stack.client.post(f"/jobs/{running['id']}/cancel").status_code in (200, 202)
    assert stack.wait_terminal(running["id"], timeout_s=60)["status"] == "cancelled"

    job_ids = [done["id"], failed["id"], running["id"]]
    for path, text in _api_answers(stack, job_ids):
        _assert_clean(f"GET {path}", text)

    stack.stop()  # shutdown logs too
    scanned = 0
    for file in sorted(p for p in stack.data_dir.rglob("*") if p.is_file()):
        _assert_clean(str(file), file.read_bytes().decode("utf-8", errors="replace"))
        scanned += 1
    names = {p.name for p in stack.data_dir.rglob("*") if p.is_file()}
    assert {"worker.log", "api.log", "spec.json", "launcher.log", "rank-0.log"} <= names, names
    banner = (stack.data_dir / "worker.log").read_text(errors="replace")
    # the transport is named by its class path (halfcast.core.broker.redis_transport:Transport://...), the password masked
    assert re.search(r"transport:\s+\S*[Tt]ransport://:\*+@127\.0\.0\.1", banner), (
        "Celery's banner shows the masked broker URL"
    )
    assert scanned > 10
