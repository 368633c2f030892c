"""Reading log files in bounded memory: ``read_tail`` (backwards from the end) and ``LineFollower``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from server.streams import logtail
from server.streams.logtail import LineFollower, read_tail


def _write(path: Path, text: bytes) -> Path:
    path.write_bytes(text)
    return path


def test_tail_returns_the_last_lines_in_order(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.log", b"".join(b"line %d\n" % i for i in range(1000)))
    tail = read_tail(path, 3)
    assert tail.lines == ["line 997", "line 998", "line 999"] and tail.end == path.stat().st_size
    assert read_tail(path, 5000).lines == [f"line {i}" for i in range(1000)]
    assert read_tail(path, 0).lines == []


@pytest.mark.parametrize("lines", [1, 2, 7, 50])
def test_tail_is_exact_across_block_edges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: int) -> None:
    """Tiny blocks: a line starting exactly at a block edge is kept whole, a cut one is never returned."""
    monkeypatch.setattr(logtail, "BLOCK_BYTES", 4)
    text = b"".join(b"%s\n" % (b"x" * (i % 9)) for i in range(100))
    path = _write(tmp_path / "a.log", text)
    expected = [line.decode() for line in text.split(b"\n")[:-1]][-lines:]
    assert read_tail(path, lines).lines == expected


def test_partial_last_line_is_kept_or_left_out(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.log", b"one\ntwo\nthr")
    assert read_tail(path, 2) == logtail.Tail(["two", "thr"], 11)
    assert read_tail(path, 2, complete_only=True) == logtail.Tail(["one", "two"], 8)
    assert read_tail(_write(tmp_path / "b.log", b"no newline yet"), 5, complete_only=True) == logtail.Tail([], 0)
    assert read_tail(_write(tmp_path / "c.log", b""), 5) == logtail.Tail([], 0)


def test_tail_reads_at_most_max_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A huge file (or one endless line) costs at most ``max_bytes``: earlier lines are simply not returned."""
    path = _write(tmp_path / "a.log", b"a" * 100_000 + b"\nlast\n")
    reads: list[int] = []
    real_open = Path.open

    def counting_open(self: Path, *args: Any, **kwargs: Any) -> Any:  # Path.open, any of its overloads
        handle = real_open(self, *args, **kwargs)
        real_read = handle.read

        def read(size: int = -1) -> bytes:
            data = real_read(size)
            reads.append(len(data))
            return data

        handle.read = read
        return handle

    monkeypatch.setattr(Path, "open", counting_open)
    assert read_tail(path, 10, max_bytes=1000).lines == ["last"]
    assert sum(reads) <= 1001


def test_crlf_and_invalid_utf8_are_tolerated(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.log", b"ok\r\nbad \xff byte\n")
    assert read_tail(path, 5).lines == ["ok", "bad \ufffd byte"]


def test_follower_returns_complete_lines_and_holds_back_the_partial_one(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    follower = LineFollower(path)
    assert follower.read() == []  # not there yet
    with path.open("ab") as handle:
        handle.write(b"first\nsec")
        handle.flush()
        assert follower.read() == ["first"]
        handle.write(b"ond\nthird")
        handle.flush()
        assert follower.read() == ["second"]
    assert follower.read() == []
    assert follower.flush() == ["third"] and follower.flush() == []


def test_follower_starts_where_the_tail_ended(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.log", b"1\n2\n3\npart")
    tail = read_tail(path, 2, complete_only=True)
    follower = LineFollower(path, tail.end)
    with path.open("ab") as handle:
        handle.write(b"ial\n4\n")
    assert tail.lines + follower.read() == ["2", "3", "partial", "4"]


def test_follower_bounds_memory_per_read_and_per_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logtail, "CHUNK_BYTES", 10)
    monkeypatch.setattr(logtail, "MAX_LINE_BYTES", 8)
    path = _write(tmp_path / "a.log", b"abcdefghijklmnopqrstuvwxyz\nend\n")
    follower = LineFollower(path)
    lines: list[str] = []
    while True:
        lines += follower.read()
        if not follower.behind:
            break
    assert lines == ["abcdefgh", "ijklmnop", "qrstuvwx", "yz", "end"]


def test_follower_never_holds_back_more_than_one_line_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An endless line without a newline (a progress bar) is passed on in pieces as it grows."""
    monkeypatch.setattr(logtail, "MAX_LINE_BYTES", 8)
    path = _write(tmp_path / "a.log", b"x" * 20)
    follower = LineFollower(path)
    assert follower.read() == ["x" * 8, "x" * 8]
    assert follower.flush() == ["x" * 4]
