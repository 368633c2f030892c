"""Field case C23 (Arize-ai/phoenix#3949, PrefectHQ/prefect#10956): concurrent writers on SQLite lose nothing.

Embedded SQLite; 8 concurrent writers (4 threads here, and 2 processes with 2
threads each) each write 200 step records through the worker's ``JobStore`` while
``GET /jobs`` is polled. Right outcome: no "database is locked" reaches anyone; all
1600 records are stored; every GET succeeds.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

from c23_writer import STEPS, write_steps
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from worker_support import insert_job, small_spec

from halfcast.core.db.engine import make_engine
from halfcast.core.db.migrate import upgrade_database
from halfcast.core.db.models import Job, StepRow
from halfcast.core.settings import Settings
from server.app import create_app
from worker.store import Fence, JobStore

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).with_name("c23_writer.py")


class NoQueue:
    def enqueue(self, job_id: str) -> None:
        raise AssertionError("nothing is submitted in this test")


def test_concurrent_sqlite_writers_lose_nothing(data_dir: Path, tmp_path: Path) -> None:
    """C23."""
    settings = Settings(data_dir=data_dir, auth=False)  # the API only reads here; auth is tested in tests/server
    url = settings.effective_database_url
    upgrade_database(url)
    engine = make_engine(url)
    store = JobStore(engine)
    fences = []
    for index in range(8):
        job_id = insert_job(engine, small_spec(max_steps=STEPS))
        claim = store.claim(job_id, f"writer-{index}", settings.runs_dir)
        assert claim is not None
        fences.append(claim.fence)
    go = tmp_path / "go"
    processes = [_writer_process(url, go, fences[4 + 2 * p : 6 + 2 * p]) for p in range(2)]
    for process in processes:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    errors: list[str] = []
    threads = [threading.Thread(target=write_steps, args=(store, fence, errors)) for fence in fences[:4]]
    polls: list[int] = []
    with TestClient(create_app(settings, NoQueue())) as client:
        stop = threading.Event()
        poller = threading.Thread(target=_poll, args=(client, stop, polls))
        poller.start()
        go.touch()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=240)
        outputs = [process.communicate(timeout=240) for process in processes]
        stop.set()
        poller.join(timeout=60)
    assert errors == []
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr
        assert "database is locked" not in stderr
    assert polls and all(code == 200 for code in polls), sorted(set(polls))
    assert len(polls) >= 5  # the API kept answering while the writers ran
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(StepRow)).scalar_one() == 8 * STEPS
        steps = dict(conn.execute(select(Job.id, Job.step)).all())
    assert all(steps[fence.job_id] == STEPS for fence in fences)
    engine.dispose()


def _writer_process(url: str, go: Path, fences: list[Fence]) -> subprocess.Popen[str]:
    pairs = [f"{fence.job_id}:{fence.owner}" for fence in fences]
    env = {"PYTHONPATH": f"{ROOT}{':'}{WRITER.parent}", "PATH": "/usr/bin:/bin"}
    return subprocess.Popen(
        [sys.executable, str(WRITER), url, str(go), *pairs],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _poll(client: TestClient, stop: threading.Event, codes: list[int]) -> None:
    while not stop.is_set():
        try:
            codes.append(client.get("/jobs", params={"limit": 50}).status_code)
        except Exception as exc:  # noqa: BLE001  # any error is a failed GET
            codes.append(-1)
            log.error("GET /jobs failed: %s", exc)
        time.sleep(0.02)
