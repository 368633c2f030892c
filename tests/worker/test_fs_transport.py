"""The embedded broker never loses a message published by another process while a worker consumes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kombu import Connection

from halfcast.core.broker.celery_app import broker_transport_options, create_celery_app
from halfcast.core.broker.fs_transport import TRANSPORT_PATH, Transport
from halfcast.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 400

PUBLISHER = """
import sys
from kombu import Connection
from halfcast.core.settings import Settings
from halfcast.core.broker.celery_app import broker_transport_options
options = {**broker_transport_options(Settings(data_dir=sys.argv[1])), "polling_interval": 0.0}
with Connection("filesystem://", transport=sys.argv[2], transport_options=options) as conn:
    queue = conn.SimpleQueue("race")
    for i in range(int(sys.argv[3])):
        queue.put({"i": i, "pad": "x" * 20000})
"""


def test_celery_app_uses_the_atomic_transport(data_dir: Path) -> None:
    app = create_celery_app(Settings(data_dir=data_dir))
    with app.connection_for_write() as conn:
        assert conn.get_transport_cls() is Transport


def test_no_message_is_lost_while_another_process_publishes(data_dir: Path) -> None:
    options = {**broker_transport_options(Settings(data_dir=data_dir)), "polling_interval": 0.0}
    publisher = subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, str(data_dir), TRANSPORT_PATH, str(MESSAGES)], cwd=ROOT
    )
    received: list[int] = []
    errors: list[ValueError] = []
    with Connection("filesystem://", transport_options=options) as conn:  # kombu's own consumer
        queue = conn.SimpleQueue("race")
        idle = 0
        while len(received) + len(errors) < MESSAGES and idle < 40:
            try:
                message = queue.get(timeout=0.25)
            except queue.Empty:
                idle += 1 if publisher.poll() is not None else 0
                continue
            except ValueError as exc:  # a torn file: the payload does not decode
                errors.append(exc)
                continue
            received.append(message.payload["i"])
            message.ack()
    assert publisher.wait(timeout=60) == 0
    assert errors == [] and sorted(received) == list(range(MESSAGES))
