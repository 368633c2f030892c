"""Each rank's stdout and stderr in its own log per attempt (real torchrun, 2 CPU ranks), and failures quoting it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from worker_support import small_spec

from halfcast.contracts.rundir import JobRuns, RunDir
from halfcast.contracts.spec import JobSpec
from halfcast.core.settings import Settings
from worker.launch.process_tree import build_command, build_environment, start_run
from worker.launch.rank_output import USAGE_EXIT, main
from worker.lifecycle.outcomes import exit_outcome

HERE = Path(__file__).resolve().parent


def _run_two_ranks(tmp_path: Path, attempt: int, name: str | None = None) -> tuple[Path, int]:
    """Launch ``rank_echo`` on 2 ranks under torchrun in attempt ``attempt``'s run directory; its exit status."""
    run_dir = JobRuns.of(tmp_path / "runs", "job").attempt(attempt).path
    run_dir.mkdir(parents=True)
    spec = JobSpec.model_validate(small_spec(processes=2, name=name))
    (run_dir / "spec.json").write_text(spec.model_dump_json())
    env = build_environment(spec, Settings(data_dir=tmp_path), {**os.environ, "PYTHONPATH": str(HERE)})
    process = start_run(build_command(spec, run_dir / "spec.json", run_dir, module="rank_echo"), run_dir, env)
    deadline = time.monotonic() + 60
    while (code := process.poll()) is None:
        assert time.monotonic() < deadline, "torchrun did not finish"
        time.sleep(0.05)
    return run_dir, code


def _expected(rank: int) -> str:
    return "".join(f"rank {rank} out {i}\nrank {rank} err {i}\n" for i in range(3)) + f"rank {rank} partial"


@pytest.mark.slow
def test_each_rank_keeps_its_own_stdout_and_stderr_per_attempt(tmp_path: Path) -> None:
    first, code = _run_two_ranks(tmp_path, 1)
    assert code == 0, RunDir(first).launcher_log.read_text()
    second, _ = _run_two_ranks(tmp_path, 2)  # a retry: a new run directory; the first attempt's logs stay
    for run_dir in (first, second):
        for rank in (0, 1):
            note, text = RunDir(run_dir).rank_log(rank).read_text().split("\n", 1)
            assert note.endswith(
                f" rank{rank} INFO worker.launch.rank_output: start-up: starting python -m rank_echo (imports)"
            )
            assert text == _expected(rank)  # stdout and stderr interleaved, in order
        assert "rank 0 out" not in RunDir(run_dir).launcher_log.read_text()  # torchrun's own output only


@pytest.mark.slow
def test_a_failed_rank_s_own_log_is_quoted_in_the_failure(tmp_path: Path) -> None:
    run_dir, code = _run_two_ranks(tmp_path, 1, name="rank-1-fails")
    assert code != 0
    assert "boom from rank 1" in RunDir(run_dir).rank_log(1).read_text()
    outcome = exit_outcome(code, None, run_dir)
    assert (outcome.status, outcome.reason) == ("failed", "rank_failed")
    assert outcome.message is not None and "--- last lines of logs/rank-1.log ---" in outcome.message
    assert outcome.message.endswith("rank 1 partial\nboom from rank 1")
    assert "rank 0 out" not in outcome.message


def test_the_wrapper_refuses_to_run_without_a_rank(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RANK", raising=False)
    assert main(["/tmp/logs", "trainer"]) == USAGE_EXIT
    assert "usage:" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "0")
    assert main(["/tmp/logs"]) == USAGE_EXIT
