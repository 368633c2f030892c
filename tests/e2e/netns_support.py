"""Separate hosts on one machine for multi-node tests: Linux network namespaces on a bridge.

:func:`make_hosts` creates the bridge ``hcbr<w>`` (10.77.<w>.1/24 in the root namespace) and one
namespace ``hc-gang-<w>-<n>`` per host, joined to it by a veth pair ``hcv<w>x<n>`` / ``hcv<w>x<n>p``
with the address 10.77.<w>.<n + 2>, where ``<w>`` is the pytest-xdist worker's index
(``tests/parallel_support.py``), so workers running at once never share a name or a subnet;
everything is removed again on exit, also after a failure (and stale leftovers of an interrupted
run first). PostgreSQL and Redis listen on 127.0.0.1 only, so a
small asyncio TCP forwarder (:class:`Forwarder`) serves them on the bridge address. Every
host runs ``python -m worker`` under ``ip netns exec``; the run directory is this machine's
filesystem, shared as the docs require.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from parallel_support import worker_index

#: This xdist worker's index: its own bridge, namespaces, veth pairs and /24.
_WORKER = worker_index()
BRIDGE = f"hcbr{_WORKER}"
SUBNET = f"10.77.{_WORKER}"
BRIDGE_ADDRESS = f"{SUBNET}.1"
PREFIX = f"hc-gang-{_WORKER}-"


def netns_unavailable() -> str | None:
    """Why namespaces cannot be made here (the skip reason), or ``None``."""
    if os.geteuid() != 0:
        return "multi-node tests need root to create network namespaces (ip netns)"
    if shutil.which("ip") is None:
        return "multi-node tests need iproute2's ip command"
    probe = f"{PREFIX}probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"network namespaces cannot be made here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` (in ``netns`` when given)."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run([*prefix, "ip", *args], capture_output=True, text=True, check=check)


@dataclass(frozen=True)
class Host:
    """One namespace: its name, address and host-side veth."""

    netns: str
    address: str
    veth: str

    def pids(self) -> list[int]:
        """Processes running in this namespace."""
        found = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True)
        return [int(pid) for pid in found.stdout.split()]

    def partition(self) -> None:
        """Cut this host off the bridge (database, broker and the other hosts)."""
        ip("link", "set", self.veth, "down")


def _veth(n: int) -> str:
    """Host-side name of host ``n``'s veth pair (its peer adds ``p``; at most 15 characters)."""
    return f"hcv{_WORKER}x{n}"


def _cleanup(count: int) -> None:
    for n in range(count):
        netns = f"{PREFIX}{n}"
        for pid in Host(netns, "", "").pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        ip("netns", "del", netns, check=False)
        ip("link", "del", _veth(n), check=False)
    ip("link", "del", BRIDGE, check=False)


@contextlib.contextmanager
def make_hosts(count: int) -> Iterator[list[Host]]:
    """``count`` namespaces on the bridge (see the module's docstring); removed on exit."""
    _cleanup(count)
    try:
        ip("link", "add", BRIDGE, "type", "bridge")
        ip("addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE)
        ip("link", "set", BRIDGE, "up")
        hosts = []
        for n in range(count):
            host = Host(f"{PREFIX}{n}", f"{SUBNET}.{n + 2}", _veth(n))
            ip("netns", "add", host.netns)
            ip("link", "add", host.veth, "type", "veth", "peer", "name", f"{host.veth}p")
            ip("link", "set", f"{host.veth}p", "netns", host.netns)
            ip("link", "set", host.veth, "master", BRIDGE, "up")
            ip("addr", "add", f"{host.address}/24", "dev", f"{host.veth}p", netns=host.netns)
            ip("link", "set", f"{host.veth}p", "up", netns=host.netns)
            ip("link", "set", "lo", "up", netns=host.netns)
            hosts.append(host)
        yield hosts
    finally:
        _cleanup(count)


class Forwarder:
    """Forwards TCP connections to ``listen:port`` on to ``target``, in a thread of its own."""

    def __init__(self, listen: str, port: int, target: tuple[str, int]) -> None:
        self.listen, self.port, self.target = listen, port, target
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name=f"forward-{port}")
        self.server: asyncio.AbstractServer | None = None

    def start(self) -> Forwarder:
        """Listen (the port is bound when this returns)."""
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, self.listen, self.port, reuse_address=True), self.loop
        ).result(10)
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            target_reader, target_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, target_writer), _pipe(target_reader, writer))

    def stop(self) -> None:
        """Stop listening and the loop."""
        if self.server is not None:
            self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
