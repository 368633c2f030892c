"""The ports test servers listen on: each xdist worker's own, outside the kernel's ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import parallel_support
import pytest
from parallel_support import PORT_BASE, PORTS_PER_WORKER, free_port, worker_index

from bench import load_stack


def _ephemeral_range() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def test_ports_are_this_workers_own_below_the_ephemeral_range_and_never_repeat() -> None:
    ports = [free_port() for _ in range(20)]
    block = PORT_BASE + worker_index() * PORTS_PER_WORKER
    assert all(block <= port < block + PORTS_PER_WORKER for port in ports), ports
    assert len(set(ports)) == len(ports)
    assert max(ports) < _ephemeral_range()[0]  # a client connection never takes one as its local port


def test_a_port_someone_listens_on_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", taken))
        listener.listen()
        offsets = iter([taken - PORT_BASE - worker_index() * PORTS_PER_WORKER, 999])
        monkeypatch.setattr(parallel_support, "_port_offsets", offsets)
        assert free_port() == PORT_BASE + worker_index() * PORTS_PER_WORKER + 999


def test_the_benches_servers_take_ports_below_the_ephemeral_range_too() -> None:
    ports = {load_stack.free_port() for _ in range(20)}
    assert all(port in load_stack.BENCH_PORTS for port in ports), ports
    assert max(load_stack.BENCH_PORTS) < _ephemeral_range()[0]
    assert max(load_stack.BENCH_PORTS) < PORT_BASE  # never one a test's server takes
