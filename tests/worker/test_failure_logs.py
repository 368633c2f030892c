"""Which log a failure quotes: the failing rank's own (from error.json or torchrun's root cause), else the launcher's."""

from __future__ import annotations

import json
from pathlib import Path

from halfcast.contracts.rundir import RunDir
from worker.lifecycle.failure_logs import RootCause, failure_log, root_cause
from worker.lifecycle.outcomes import TYPED_TAIL_LINES, exit_outcome

#: torchrun 2.13's report when rank 1 failed first and rank 0 was then stopped (as printed into launcher.log).
TORCHRUN_REPORT = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
worker.launch.rank_output FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_05:51:13
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 9053)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 9053
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_05:51:13
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 9054)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def _run_dir(tmp_path: Path, launcher: str = "", ranks: dict[int, str] | None = None) -> Path:
    RunDir(tmp_path).launcher_log.parent.mkdir(parents=True, exist_ok=True)
    RunDir(tmp_path).launcher_log.write_text(launcher)
    for rank, text in (ranks or {}).items():
        RunDir(tmp_path).rank_log(rank).write_text(text)
    return tmp_path


def test_root_cause_is_read_from_torchruns_report() -> None:
    assert root_cause(TORCHRUN_REPORT) == RootCause(1, 1)  # not rank 0, which was only stopped afterwards
    killed = "Root Cause (first observed failure):\n[0]:\n  rank      : 3 (local_rank: 3)\n  exitcode  : -9 (pid: 7)"
    assert root_cause(killed) == RootCause(3, -9)
    assert root_cause("Traceback ...\nValueError: no report") is None


def test_failure_log_is_the_ranks_own_when_it_has_output(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, ranks={0: "", 1: "boom"})
    assert failure_log(run_dir, 1) == RunDir(run_dir).rank_log(1)
    assert failure_log(run_dir, 0) == RunDir(run_dir).launcher_log  # empty
    assert failure_log(run_dir, 5) == RunDir(run_dir).launcher_log  # absent
    assert failure_log(run_dir, None) == RunDir(run_dir).launcher_log


def test_rank_failed_quotes_the_root_cause_ranks_log(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, TORCHRUN_REPORT, {0: "rank 0 was fine\n", 1: "step 3\nValueError: bad batch\n"})
    outcome = exit_outcome(1, None, run_dir)
    assert outcome.reason == "rank_failed" and outcome.message is not None
    assert outcome.message == (
        "the trainer exited with exit code 1 (rank 1 failed first: exit code 1)\n"
        "--- last lines of logs/rank-1.log ---\nstep 3\nValueError: bad batch"
    )


def test_error_json_names_the_rank_whose_log_is_quoted(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, "", {0: "rank 0 waiting\n", 1: "loss is nan\n"})
    (run_dir / "error.json").write_text(json.dumps({"reason": "nonfinite_loss", "message": "NaN", "rank": 1}))
    outcome = exit_outcome(3, None, run_dir)
    assert outcome.reason == "nonfinite_loss"
    assert outcome.message == "NaN (rank 1)\n--- last lines of logs/rank-1.log ---\nloss is nan"


def test_a_typed_error_quotes_only_the_last_lines_before_it(tmp_path: Path) -> None:
    """C11-like: 50 steps of warnings precede ``nonfinite_gradients``; the message keeps its point, not all of them."""
    warnings = "".join(f"fault injection: gradient element set to nan at step {n}\n" for n in range(1, 51))
    run_dir = _run_dir(tmp_path, "", {0: warnings + "TrainerError: nonfinite_gradients\n"})
    (run_dir / "error.json").write_text(json.dumps({"reason": "nonfinite_gradients", "message": "50 skips", "rank": 0}))
    outcome = exit_outcome(3, None, run_dir)
    assert outcome.message is not None
    quoted = outcome.message.split("--- last lines of logs/rank-0.log ---\n")[1].splitlines()
    assert len(quoted) == TYPED_TAIL_LINES and quoted[-1] == "TrainerError: nonfinite_gradients"


def test_known_causes_are_found_in_a_ranks_log(tmp_path: Path) -> None:
    """Rank output no longer reaches launcher.log: an OOM printed by a rank must still be recognised."""
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    run_dir = _run_dir(tmp_path, TORCHRUN_REPORT, {0: "fine\n", 1: oom + "\n"})
    outcome = exit_outcome(1, None, run_dir)
    assert outcome.reason == "oom" and outcome.message is not None and outcome.message.endswith(oom)


def test_without_rank_logs_the_launcher_log_is_quoted_as_before(tmp_path: Path) -> None:
    outcome = exit_outcome(1, None, _run_dir(tmp_path, "RuntimeError: injected\n"))
    assert (
        outcome.message
        == "the trainer exited with exit code 1\n--- last lines of logs/launcher.log ---\nRuntimeError: injected"
    )


def test_a_killed_ranks_signal_is_named_even_though_its_own_log_is_quoted(tmp_path: Path) -> None:
    """The rank's log cannot say it was SIGKILLed; torchrun's report can, so the headline carries it."""
    report = "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 7)\n"
    run_dir = _run_dir(tmp_path, report, {0: "fine\n", 1: "step 14\n"})
    outcome = exit_outcome(1, None, run_dir)
    assert outcome.reason == "rank_failed" and outcome.message is not None
    assert outcome.message.startswith("the trainer exited with exit code 1 (rank 1 failed first: signal SIGKILL)\n")
    assert outcome.message.endswith("--- last lines of logs/rank-1.log ---\nstep 14")
