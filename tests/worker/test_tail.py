"""RecordTail: incremental, never a partial line, tolerant of a missing file."""

from __future__ import annotations

import json
from pathlib import Path

from worker.records.tail import RecordTail


def test_missing_file_reads_nothing(tmp_path: Path) -> None:
    assert RecordTail(tmp_path / "records.jsonl").read_new() == []


def test_partial_last_line_is_held_back_until_complete(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    tail = RecordTail(path)
    path.write_text('{"type": "step", "step": 1}\n{"type": "step", "st')
    assert tail.read_new() == [{"type": "step", "step": 1}]
    assert tail.read_new() == []
    with path.open("a") as handle:
        handle.write('ep": 2}\n')
    assert tail.read_new() == [{"type": "step", "step": 2}]
    assert tail.offset == path.stat().st_size


def test_reads_only_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    tail = RecordTail(path)
    with path.open("a") as handle:
        for step in range(1, 4):
            handle.write(json.dumps({"step": step}) + "\n")
            handle.flush()
            assert tail.read_new() == [{"step": step}]
    assert tail.read_new() == []


def test_malformed_lines_are_skipped_once(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text('not json\n[1, 2]\n\n{"step": 7}\n')
    tail = RecordTail(path)
    assert tail.read_new() == [{"step": 7}]
    assert tail.read_new() == []


def test_drain_reads_a_backlog_in_small_chunks(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps({"step": step}) + "\n" for step in range(1, 101)))
    tail = RecordTail(path, max_bytes=64)
    assert [record["step"] for record in tail.drain()] == list(range(1, 101))


def test_a_line_longer_than_the_chunk_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    record = {"step": 1, "note": "x" * 500}
    path.write_text(json.dumps(record) + "\n")
    assert RecordTail(path, max_bytes=16).read_new() == [record]


def test_step_records_up_to_keeps_the_last_occurrence_of_a_rerun_step(tmp_path: Path) -> None:
    from worker.records.tail import step_records_up_to

    lines = [
        {"type": "start"},
        {"type": "step", "step": 1, "precision": "fp16"},
        {"type": "step", "step": 2},
        {"type": "precision_switch", "rewound_to_step": 1},
        {"type": "step", "step": 2, "precision": "bf16"},
        {"type": "step", "step": 3},
    ]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    records = step_records_up_to(tmp_path / "records.jsonl", 2)
    assert [record.body() for record in records] == [{"step": 1, "precision": "fp16"}, {"step": 2, "precision": "bf16"}]
    assert step_records_up_to(tmp_path / "missing.jsonl", 5) == []
