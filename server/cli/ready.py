"""``halfcast up`` says where the API is once it answers: its URL, and the ``HALFCAST_URL`` line to export.

The CLI's job commands and the README's curl lines default to port 8000; on another
port (``--port``, ``HALFCAST_PORT``) they need ``HALFCAST_URL``. :func:`announce_when_ready`
polls the API's ``/readyz`` in a background thread and, at its first 200, prints
:func:`ready_message` on stdout; it gives up with a warning after :data:`READY_WAIT_S`
(the stack runs on: ``/readyz`` names what is down).
"""

from __future__ import annotations

import ipaddress
import logging
import sys
import threading
import time
from pathlib import Path

import httpx

log = logging.getLogger(__name__)

#: Seconds ``up`` waits for the API's first ready answer before it stops waiting to announce it.
READY_WAIT_S = 120.0
#: Seconds between two readiness requests.
READY_POLL_S = 0.25
#: Addresses that mean "every interface": a client on this machine reaches them on loopback.
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def client_url(host: str, port: int) -> str:
    """The URL a client on this machine uses for an API listening on ``host:port`` (IPv6 in brackets)."""
    host = WILDCARDS.get(host, host)
    try:
        bracketed = ipaddress.ip_address(host).version == 6
    except ValueError:  # a host name
        bracketed = False
    return f"http://[{host}]:{port}" if bracketed else f"http://{host}:{port}"


def ready_message(url: str, data_dir: Path) -> str:
    """What ``up`` prints once the API at ``url`` is ready: the URL, and the ``export`` line for the CLI and curl."""
    return (
        f"Halfcast API ready at {url} (data: {data_dir}); for the CLI and curl in another shell:\n"
        f"  export HALFCAST_URL={url}\n"
    )


def wait_until_ready(url: str, stop: threading.Event, wait_s: float = READY_WAIT_S) -> bool:
    """Poll ``url``/readyz until it answers 200 (``True``), ``wait_s`` passes or ``stop`` is set (``False``)."""
    deadline = time.monotonic() + wait_s
    with httpx.Client(base_url=url, timeout=READY_POLL_S * 8) as client:
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                if client.get("/readyz").status_code == 200:
                    return True
            except httpx.HTTPError:
                pass  # not listening yet
            stop.wait(READY_POLL_S)
    return False


def announce_when_ready(
    url: str, data_dir: Path, stop: threading.Event, wait_s: float = READY_WAIT_S
) -> threading.Thread:
    """Start a daemon thread that prints :func:`ready_message` once the API at ``url`` is ready."""

    def announce() -> None:
        if wait_until_ready(url, stop, wait_s):
            sys.stdout.write(ready_message(url, data_dir))
            sys.stdout.flush()
        elif not stop.is_set():
            log.warning("the API at %s was not ready within %.0f s (see %s/readyz)", url, wait_s, url)

    thread = threading.Thread(target=announce, name="announce-ready", daemon=True)
    thread.start()
    return thread
