"""How a run's end becomes a typed outcome: error.json, known causes in the log, OOM-killed ranks."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from worker.outcomes import exit_outcome

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
    assert exit_outcome(0, True, _run_dir(tmp_path)).status == "succeeded"
    assert exit_outcome(0, False, _run_dir(tmp_path)).reason == "rank_failed"


def test_error_json_wins(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, "CUDA out of memory", {"reason": "nonfinite_loss", "message": "NaN", "rank": 1})
    outcome = exit_outcome(3, False, run_dir)
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
)  # fmt: skip
def test_known_causes_in_the_log(tmp_path: Path, log: str, reason: str) -> None:
    outcome = exit_outcome(1, False, _run_dir(tmp_path, "noise\n" + log + "\n" + "x\n" * 300))
    assert (outcome.status, outcome.reason) == ("failed", reason)


def test_a_rank_killed_by_sigkill_is_oom_only_when_the_oom_killer_ran(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, TORCHRUN_SIGKILL)
    assert exit_outcome(1, False, run_dir, oom_killed=True).reason == "oom"
    assert exit_outcome(1, False, run_dir, oom_killed=False).reason == "rank_failed"
    assert exit_outcome(-signal.SIGKILL, False, _run_dir(tmp_path, ""), oom_killed=True).reason == "oom"
    assert exit_outcome(1, False, _run_dir(tmp_path, "exit code 1"), oom_killed=True).reason == "rank_failed"
