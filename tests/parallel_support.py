"""Which pytest-xdist worker this process is, for the names and numbers a worker must not share.

``make test`` runs the suite on several xdist workers at once (docs/development.md). What the
operating system hands out (``tmp_path``) is already private to a test; what a test names
itself is made private here: the Redis database index (:func:`redis_database`), the ports its
servers listen on (:func:`free_port`) and the network-namespace names and subnet of the
multi-node tests (``tests/e2e/netns_support.py``). PostgreSQL databases and Celery queue names
carry a random suffix of their own.
"""

from __future__ import annotations

import itertools
import os
import socket

#: Redis serves databases 0-15 by default; worker ``n`` uses database ``n`` (``gw0`` and a run without xdist: 0).
REDIS_DATABASES = 16
#: Worker ``n``'s servers listen on ports ``PORT_BASE + n * PORTS_PER_WORKER`` onwards: below the kernel's
#: ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default), whose ports outgoing
#: connections take as their own. A port found free there by binding port 0 could be taken by a client's
#: connection (to PostgreSQL, Redis, another stack) before the server meant to listen on it binds it:
#: "address already in use" (seen in make test). Each worker has its own block, and takes each port once.
PORT_BASE = 20000
PORTS_PER_WORKER = 1000
_port_offsets = itertools.count()


def worker_index() -> int:
    """``n`` of the xdist worker ``gw<n>`` running this process; 0 without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name.removeprefix("gw") or 0)


def redis_database(url: str, index: int) -> str:
    """``url`` with its database path replaced by ``/<index mod 16>`` (``redis://host:port/<db>``)."""
    base, _, last = url.rpartition("/")
    if not base.endswith("/") and last.isdigit():  # redis://host:port/<db>
        return f"{base}/{index % REDIS_DATABASES}"
    return f"{url.rstrip('/')}/{index % REDIS_DATABASES}"


def free_port() -> int:
    """A loopback TCP port nobody listens on, this worker's own, never handed out before in this process."""
    block = PORT_BASE + worker_index() * PORTS_PER_WORKER
    for _ in range(PORTS_PER_WORKER):
        port = block + next(_port_offsets) % PORTS_PER_WORKER
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # a server of an earlier run, or a connection still in TIME_WAIT
                continue
        return port
    raise RuntimeError(f"no free port in {block}-{block + PORTS_PER_WORKER - 1}")
