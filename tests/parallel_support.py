"""Which pytest-xdist worker this process is, for the names and numbers a worker must not share.

``make test`` runs the suite on several xdist workers at once (docs/development.md). What the
operating system hands out (ports, ``tmp_path``) is already private to a test; what a test
names itself is made private here: the Redis database index (:func:`redis_database`) and the
network-namespace names and subnet of the multi-node tests (``tests/e2e/netns_support.py``).
PostgreSQL databases and Celery queue names carry a random suffix of their own.
"""

from __future__ import annotations

import os

#: Redis serves databases 0-15 by default; worker ``n`` uses database ``n`` (``gw0`` and a run without xdist: 0).
REDIS_DATABASES = 16


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
