"""The API imports nothing of the worker, nor torch: not to start, and not to publish a job to either broker.

The broker's transports are named by their class paths and imported by kombu when a
connection is first used, so the check publishes a job (embedded broker) and resolves
the Redis transport too, in a fresh interpreter (a subprocess), then reads ``sys.modules``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Imports the app, publishes a job on the filesystem broker in argv[1], resolves the Redis transport; prints modules.
PROBE = """
import json, sys
import server.app
from halfcast.core.broker.celery_app import create_celery_app
from server.queue import CeleryJobQueue
from halfcast.core.settings import Settings
queue = CeleryJobQueue(Settings(data_dir=sys.argv[1]))
queue.enqueue("job-1")
queue.close()
with create_celery_app(Settings(broker_url="redis://127.0.0.1:1/0")).connection_for_write() as connection:
    transport = connection.get_transport_cls()
print(json.dumps({"transport": transport.__module__, "modules": sorted(sys.modules)}))
"""


def test_the_api_and_its_broker_setup_import_no_worker_and_no_torch(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    report = json.loads(result.stdout.splitlines()[-1])
    modules = set(report["modules"])
    assert report["transport"] == "halfcast.core.broker.redis_transport"
    assert {
        "halfcast.core.broker.fs_transport",
        "server.app",
    } <= modules  # it did publish, through the atomic transport
    assert sorted(m for m in modules if m.split(".")[0] in ("worker", "torch")) == []
    assert list((tmp_path / "broker" / "in").glob("*.msg"))  # the message is there for a worker
