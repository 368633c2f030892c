"""Node 0's rendezvous port is held for the attempt, never one the kernel may hand out meanwhile (worker/gang/ports.py)."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from worker.gang.ports import NoRendezvousPortError, ephemeral_range, reserve_port, warn_if_ephemeral

FIRST = 29_600  # below the kernel's default ephemeral range, and the test workers' port blocks (20000 + 1000 n)


def test_a_reserved_port_is_not_handed_to_another_attempt_until_released(tmp_path: Path) -> None:
    with reserve_port("127.0.0.1", FIRST, FIRST + 1, tmp_path) as first:
        second = reserve_port("127.0.0.1", FIRST, FIRST + 1, tmp_path)
        assert {first.port, second.port} == {FIRST, FIRST + 1}
        with pytest.raises(NoRendezvousPortError, match=f"{FIRST}-{FIRST + 1}"):
            reserve_port("127.0.0.1", FIRST, FIRST + 1, tmp_path)
        second.release()
        assert reserve_port("127.0.0.1", FIRST, FIRST + 1, tmp_path).port == second.port


def test_a_port_some_process_has_bound_is_skipped(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", FIRST + 2))
        squatter.listen()
        for _ in range(5):  # whatever the random start
            with reserve_port("127.0.0.1", FIRST + 2, FIRST + 3, tmp_path) as reservation:
                assert reservation.port == FIRST + 3


def test_the_reserved_port_is_free_for_the_run_to_bind(tmp_path: Path) -> None:
    with reserve_port("127.0.0.1", FIRST + 4, FIRST + 4, tmp_path) as reservation, socket.socket() as store:
        store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        store.bind(("127.0.0.1", reservation.port))  # what node 0's torchrun does with it


def test_a_range_inside_the_kernels_ephemeral_ports_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="worker.gang.ports"):
        assert warn_if_ephemeral(40_000, 40_100, (32_768, 60_999))
        assert not warn_if_ephemeral(29_500, 29_999, (32_768, 60_999))
        assert not warn_if_ephemeral(29_500, 29_999, None)
    assert len(caplog.records) == 1 and "the kernel's ephemeral range 32768-60999" in caplog.text


def test_the_kernels_range_is_read(tmp_path: Path) -> None:
    listed = tmp_path / "ip_local_port_range"
    listed.write_text("32768\t60999\n")
    assert ephemeral_range(listed) == (32_768, 60_999)
    assert ephemeral_range(tmp_path / "missing") is None
