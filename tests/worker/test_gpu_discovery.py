"""Which GPUs a worker hands out: HALFCAST_WORKER_GPUS, then its CUDA_VISIBLE_DEVICES, then nvidia-smi, then torch."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from worker.resources.gpus import discover_gpus, nvidia_smi_gpus, parse_gpu_list


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0,1,2,3", [0, 1, 2, 3]), (" 3, 1 ", [3, 1]), ("7", [7]), ("none", []), ("NONE", []), ("", []), ("-1", [])],
)
def test_gpu_lists_parse(text: str, expected: list[int]) -> None:
    assert parse_gpu_list(text) == expected


@pytest.mark.parametrize("text", ["0,x", "GPU-8f3a2c1e-0000", "MIG-1", "0,,1", "1,-2", "0,0", "1.5"])
def test_malformed_gpu_lists_are_refused_naming_the_source(text: str) -> None:
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        parse_gpu_list(text, "CUDA_VISIBLE_DEVICES")


def _never() -> list[int] | None:
    raise AssertionError("no probe may run when the GPUs are configured or inherited")


def test_the_setting_wins_over_the_environment_and_the_probes() -> None:
    assert discover_gpus("2,3", {"CUDA_VISIBLE_DEVICES": "0"}, (_never,)) == [2, 3]
    assert discover_gpus("none", {"CUDA_VISIBLE_DEVICES": "0"}, (_never,)) == []


def test_the_workers_own_cuda_visible_devices_is_honoured() -> None:
    assert discover_gpus(None, {"CUDA_VISIBLE_DEVICES": "4,6"}, (_never,)) == [4, 6]
    assert discover_gpus(None, {"CUDA_VISIBLE_DEVICES": ""}, (_never,)) == []


def test_probes_run_in_order_until_one_answers() -> None:
    calls: list[str] = []

    def absent() -> list[int] | None:
        calls.append("absent")
        return None

    def four() -> list[int] | None:
        calls.append("four")
        return [0, 1, 2, 3]

    assert discover_gpus(None, {}, (absent, four, _never)) == [0, 1, 2, 3]
    assert calls == ["absent", "four"]
    assert discover_gpus(None, {}, (absent,)) == []


def _fake_nvidia_smi(folder: Path, body: str) -> None:
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_nvidia_smi_lines_give_the_indices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nvidia_smi(
        tmp_path,
        "echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaa)'\n"
        "echo '  MIG 1g.10gb Device 0: (UUID: MIG-bbb)'\n"
        "echo 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-ccc)'",
    )
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert nvidia_smi_gpus() == [0, 1]


def test_a_failing_nvidia_smi_is_no_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nvidia_smi(tmp_path, "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nvidia_smi_gpus() is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert nvidia_smi_gpus() is None


def test_torch_probe_is_skipped_on_a_host_without_gpu_driver_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker.resources import gpus

    def no_subprocess(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch was imported in a subprocess on a host without GPU drivers")

    monkeypatch.setattr(gpus.subprocess, "run", no_subprocess)
    assert gpus.torch_gpus(device_nodes=(str(tmp_path / "nvidiactl"),)) == []
