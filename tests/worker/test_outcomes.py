"""How a run's end becomes a typed outcome: the end record's counts, error.json, known causes in the log, OOM-killed ranks."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from halfcast.contracts.records import EndRecord, parse_record
from trainer.records import read_records
from worker.lifecycle.outcomes import exit_outcome

#: torchrun's report when a rank died of SIGKILL (as torch 2.13 prints it).
TORCHRUN_SIGKILL = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 28691)  (SIGKILL)
  traceback : Signal 9 (SIGKILL) received by PID 28691
"""


def _run_dir(tmp_path: Path, log: str = "", error: dict[str, object] | None = None) -> Path:
    (tmp_path / "logs").mkdir(exist_ok=True)
    (tmp_path / "logs" / "launcher.log").write_text(log)
    if error is not None:
        (tmp_path / "error.json").write_text(json.dumps(error))
    return tmp_path


def test_success_needs_exit_0_and_the_end_record(tmp_path: Path) -> None:
    assert (
        exit_outcome(0, EndRecord(steps=10, skipped_steps=2, applied_steps=8), _run_dir(tmp_path)).status == "succeeded"
    )
    assert exit_outcome(0, None, _run_dir(tmp_path)).reason == "rank_failed"


@pytest.mark.parametrize(
    "counts",
    [
        {"steps": 10, "skipped_steps": 10, "applied_steps": 0},  # what the trainer's end check refuses to write
        {"steps": 10, "skipped_steps": 10},  # an older trainer's end record: no applied_steps
        {"steps": 10, "skipped_steps": 0, "applied_steps": 0},  # records contradicting themselves: the lower count wins
        {"steps": 10, "skipped_steps": 10, "applied_steps": 10},
    ],
)  # fmt: skip  # a case table, laid out by hand
def test_an_end_record_that_applied_no_update_is_no_success(tmp_path: Path, counts: dict[str, int]) -> None:
    (tmp_path / "records.jsonl").write_text(json.dumps({"type": "end", "time": 1.0, **counts}) + "\n")
    [line] = read_records(tmp_path)
    end = parse_record(line)
    assert isinstance(end, EndRecord)
    outcome = exit_outcome(0, end, _run_dir(tmp_path))
    assert (outcome.status, outcome.reason) == ("failed", "no_update_applied")
    assert outcome.message is not None and "10 attempted steps" in outcome.message


@pytest.mark.parametrize(
    "body", [{}, {"steps": 10}, {"steps": "10", "skipped_steps": 0}, {"steps": 3, "skipped_steps": -1}]
)
def test_an_end_record_without_valid_counts_is_no_end_record(body: dict[str, object]) -> None:
    assert parse_record({"type": "end", "time": 1.0, **body}) is None


def test_error_json_wins(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, "CUDA out of memory", {"reason": "nonfinite_loss", "message": "NaN", "rank": 1})
    outcome = exit_outcome(3, None, run_dir)
    assert (outcome.status, outcome.reason) == ("failed", "nonfinite_loss")
    assert outcome.message is not None and outcome.message.startswith("NaN (rank 1)")


@pytest.mark.parametrize(
    ("log", "reason"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB", "oom"),
        ("RuntimeError: [enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory", "oom"),
        ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) "
         "ran for 600046 milliseconds before timing out.", "collective_timeout"),
        ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
         "1800000ms for recv operation to complete", "collective_timeout"),
        ("ValueError: something else\n" + TORCHRUN_SIGKILL, "rank_failed"),
    ],
)  # fmt: skip  # a case table, laid out by hand
def test_known_causes_in_the_log(tmp_path: Path, log: str, reason: str) -> None:
    outcome = exit_outcome(1, None, _run_dir(tmp_path, "noise\n" + log + "\n" + "x\n" * 300))
    assert (outcome.status, outcome.reason) == ("failed", reason)


def test_a_rank_killed_by_sigkill_is_oom_only_when_the_oom_killer_ran(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, TORCHRUN_SIGKILL)
    assert exit_outcome(1, None, run_dir, oom_killed=True).reason == "oom"
    assert exit_outcome(1, None, run_dir, oom_killed=False).reason == "rank_failed"
    assert exit_outcome(-signal.SIGKILL, None, _run_dir(tmp_path, ""), oom_killed=True).reason == "oom"
    assert exit_outcome(1, None, _run_dir(tmp_path, "exit code 1"), oom_killed=True).reason == "rank_failed"


def test_a_short_end_record_succeeds_only_when_it_says_it_stopped_early(tmp_path: Path) -> None:
    stopped = {"step": 3, "metric": "loss", "best_step": 1, "best_value": 0.5}
    early = EndRecord.model_validate({"steps": 3, "skipped_steps": 0, "applied_steps": 3, "stopped_early": stopped})
    short = EndRecord(steps=3, skipped_steps=0, applied_steps=3)
    mismatched = EndRecord.model_validate({"steps": 3, "skipped_steps": 0, "stopped_early": {**stopped, "step": 2}})
    assert exit_outcome(0, early, _run_dir(tmp_path), max_steps=10).status == "succeeded"
    refused = exit_outcome(0, short, _run_dir(tmp_path), max_steps=10)
    assert (refused.status, refused.reason) == ("failed", "rank_failed") and "stopped_early" in (refused.message or "")
    assert exit_outcome(0, mismatched, _run_dir(tmp_path), max_steps=10).reason == "rank_failed"
    assert exit_outcome(0, short, _run_dir(tmp_path), max_steps=3).status == "succeeded"
