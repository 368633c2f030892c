"""Node 0's rendezvous port, reserved for the whole attempt instead of found free once and let go.

A port found free by binding port 0 and closing the socket is free *at that moment*: it is one of the
kernel's ephemeral ports, which the kernel hands to the next ``bind(0)`` or outgoing ``connect()`` on
the host. Node 0 publishes its port, waits up to ``gang_timeout_s`` for the other nodes, and only then
does its torchrun bind it: long enough for any client on a busy host to take it, and the gang to fail
on ``address already in use``.

So the port comes from ``HALFCAST_RENDEZVOUS_PORT_MIN``-``_MAX`` (29500-29999 by default), which must lie
outside the kernel's ephemeral range (``net.ipv4.ip_local_port_range``, 32768-60999 by default): the
kernel never hands those ports out, so only a process that binds one by number can take it. Two
Halfcast workers on one host never pick the same one: a port is held with an exclusive ``flock`` on
``<gpu_lock_dir>/rendezvous-<port>.lock`` (beside the GPU locks, and with their guarantees: the kernel
drops the lock when its holder dies) from the pick to the attempt's end, and it is checked free by
binding it before it is published.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import socket
from pathlib import Path
from typing import Self

from worker.resources.gpu_locks import try_lock

log = logging.getLogger(__name__)

#: Where the kernel lists its ephemeral port range.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


class NoRendezvousPortError(RuntimeError):
    """Every port of the range is held by another attempt or bound by some process."""


class PortReservation:
    """A rendezvous port held for one attempt; :meth:`release` (or leaving the ``with`` block) frees it."""

    def __init__(self, port: int, descriptor: int) -> None:
        self.port = port
        self._descriptor: int | None = descriptor

    def release(self) -> None:
        """Unlock the port (idempotent)."""
        if self._descriptor is not None:
            os.close(self._descriptor)  # closing the only descriptor drops the flock
            self._descriptor = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's ephemeral port range, or ``None`` where it cannot be read (not Linux)."""
    try:
        first, last = path.read_text().split()
        return int(first), int(last)
    except (OSError, ValueError):
        return None


def warn_if_ephemeral(first: int, last: int, kernel: tuple[int, int] | None) -> bool:
    """Log a warning (and say so) when the configured range overlaps the kernel's ephemeral ports."""
    if kernel is None or last < kernel[0] or first > kernel[1]:
        return False
    log.warning(
        "rendezvous ports %d-%d overlap the kernel's ephemeral range %d-%d: a client connection may take a"
        " gang's port before its torchrun binds it (set HALFCAST_RENDEZVOUS_PORT_MIN/_MAX outside it)",
        first,
        last,
        *kernel,
    )
    return True


def reserve_port(address: str, first: int, last: int, lock_dir: Path) -> PortReservation:
    """A port of ``first``-``last`` that no other attempt holds and nothing has bound on ``address``, held.

    Tries the range from a random start (two hosts' workers rarely contend for the same file). Raises
    :class:`NoRendezvousPortError` when every port is taken.
    """
    lock_dir.mkdir(parents=True, exist_ok=True)
    ports = list(range(first, last + 1))
    start = random.randrange(len(ports))  # spreading, not security
    for port in ports[start:] + ports[:start]:
        descriptor = try_lock(lock_dir / f"rendezvous-{port}.lock")
        if descriptor is None:
            continue
        if _bindable(address, port):
            return PortReservation(port, descriptor)
        os.close(descriptor)
    raise NoRendezvousPortError(f"no free rendezvous port in {first}-{last} on {address}")


def _bindable(address: str, port: int) -> bool:
    """Whether a listening socket could bind ``address:port`` now (as torchrun's store will, address reuse on)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
                return False
            raise
    return True
