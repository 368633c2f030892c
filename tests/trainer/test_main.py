"""``python -m trainer``: exit status, error.json for typed failures, parameter dumps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import components
from trainer.__main__ import main
from trainer.numerics.precision import PrecisionUnsupportedError

pytestmark = pytest.mark.slow  # runs python -m trainer in fresh interpreters: not in make check

REPO = Path(__file__).resolve().parents[2]
TINY = {
    "model": {"name": "mlp", "config": {"hidden_sizes": [8]}},
    "dataset": {"name": "synthetic", "config": {"num_samples": 64}},
    "micro_batch_size": 8,
    "max_steps": 3,
}


def _write_spec(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({**TINY, **fields}))
    return path


def _error(run_dir: Path) -> dict:
    return json.loads((run_dir / "error.json").read_text())


@pytest.fixture(autouse=True)
def _single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HALFCAST_ALLOW_FAULTS", "1")  # as a worker with fault injection enabled


def test_faults_are_refused_unless_the_worker_enables_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HALFCAST_ALLOW_FAULTS")
    run_dir = tmp_path / "run"
    assert main(["--spec", str(_write_spec(tmp_path, faults={"raise_at_step": 2})), "--run-dir", str(run_dir)]) == 3
    error = _error(run_dir)
    assert error["reason"] == "spec_invalid" and "HALFCAST_ALLOW_FAULTS=1" in error["message"]


def test_a_crash_exits_non_zero_without_error_json(tmp_path: Path) -> None:
    spec = _write_spec(tmp_path, faults={"raise_at_step": 2})
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "--spec", str(spec), "--run-dir", str(run_dir)],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode not in (0, 3)
    assert "raise_at_step 2" in done.stderr
    assert not (run_dir / "error.json").exists()


def test_success_and_parameter_dump(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HALFCAST_DUMP_PARAMS", "1")
    run_dir = tmp_path / "run"
    assert main(["--spec", str(_write_spec(tmp_path)), "--run-dir", str(run_dir)]) == 0
    assert (run_dir / "params-rank0.pt").exists() and (run_dir / "checkpoints" / "final.pt").exists()
    assert not (run_dir / "error.json").exists()


def test_a_trainer_error_writes_error_json(tmp_path: Path) -> None:
    spec = _write_spec(
        tmp_path, precision="fp16", max_steps=10, max_consecutive_skips=2, faults={"nonfinite_grad_steps": [1, 2, 3]}
    )
    run_dir = tmp_path / "run"
    assert main(["--spec", str(spec), "--run-dir", str(run_dir)]) == 3
    error = _error(run_dir)
    assert error["reason"] == "nonfinite_gradients" and error["rank"] == 0 and "2 consecutive" in error["message"]


def test_unavailable_data_is_typed(tmp_path: Path) -> None:
    spec = _write_spec(
        tmp_path,
        model={"name": "gpt"},
        dataset={"name": "text", "config": {"source": "file", "path": "missing/file.txt"}},
    )
    assert main(["--spec", str(spec), "--run-dir", str(tmp_path / "run")]) == 3
    assert _error(tmp_path / "run")["reason"] == "data_unavailable"


def test_an_invalid_spec_is_typed(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**TINY, "surprise": 1}))
    assert main(["--spec", str(spec), "--run-dir", str(tmp_path / "run")]) == 3
    error = _error(tmp_path / "run")
    assert error["reason"] == "spec_invalid" and "surprise" in error["message"]


def test_unsupported_precision_is_typed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise PrecisionUnsupportedError("no such hardware")

    monkeypatch.setattr(components, "build_precision", refuse)
    assert main(["--spec", str(_write_spec(tmp_path)), "--run-dir", str(tmp_path / "run")]) == 3
    assert _error(tmp_path / "run") == {"reason": "precision_unsupported", "message": "no such hardware", "rank": 0}
