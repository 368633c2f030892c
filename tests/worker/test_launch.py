"""Launching torchrun: the command, the child's environment, and stopping the whole session."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from worker_support import small_spec

from halfcast.contracts.spec import JobSpec
from halfcast.core.settings import Settings
from worker.launch.process_tree import (
    build_command,
    build_environment,
    log_tail,
    rank_threads,
    read_proc,
    session_members,
    start_run,
)


def test_command_runs_standalone_torchrun_with_one_rank_per_process(tmp_path: Path) -> None:
    spec = JobSpec.model_validate(small_spec(processes=3))
    command = build_command(spec, tmp_path / "spec.json", tmp_path)
    assert command[:3] == [
        sys.executable,
        "-m",
        "worker.launch.torchrun",
    ]  # torchrun's main, stopped without a crash report
    assert "--standalone" in command
    assert command[command.index("--nproc-per-node") + 1] == "3"
    assert command[command.index("--nnodes") + 1] == "1"
    assert command[-5:] == ["trainer", "--spec", str(tmp_path / "spec.json"), "--run-dir", str(tmp_path)]
    wrapper = command.index("-m", 3)  # each rank runs the trainer through the per-rank log wrapper
    assert command[wrapper + 1 : wrapper + 4] == ["worker.launch.rank_output", str(tmp_path / "logs"), "trainer"]
    assert not any("rdzv-endpoint" in part or "master-port" in part for part in command)


def test_environment_is_minimal_and_never_holds_service_urls(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        data_roots=[tmp_path / "a", tmp_path / "b"],
        allow_faults=False,
        model_roots=[tmp_path / "m"],
        database_url="postgresql://secret@db/x",
        broker_url="redis://secret@redis/0",
    )
    base = {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "LANG": "C.UTF-8",
        "HALFCAST_DATABASE_URL": "postgresql://secret",
        "HALFCAST_BROKER_URL": "redis://secret",
        "AWS_SECRET_ACCESS_KEY": "k",
        "PYTHONPATH": "/extra",
    }
    env = build_environment(JobSpec.model_validate(small_spec(processes=2)), settings, base)
    assert "secret" not in repr(env)
    assert {"PATH", "HOME", "LANG", "PYTHONPATH", "OMP_NUM_THREADS", "HALFCAST_DATA_ROOTS"} <= set(env)
    assert "AWS_SECRET_ACCESS_KEY" not in env and env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU job sees no GPU
    root = str(Path(__file__).resolve().parents[2])
    assert env["PYTHONPATH"].split(os.pathsep) == [root, "/extra"]
    assert env["HALFCAST_DATA_ROOTS"] == os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")])
    assert env["HALFCAST_MODEL_ROOTS"] == str(tmp_path / "m")
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "10"  # torchrun's own SIGKILL of its ranks: the grace (rounded up)
    assert (
        build_environment(JobSpec.model_validate(small_spec()), Settings(data_dir=tmp_path, cancel_grace_s=2.5), base)[
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
        ]
        == "3"
    )
    assert env["HALFCAST_REGISTRY_DIR"] == str(tmp_path.resolve() / "registry")  # registered datasets and models
    cpus = len(os.sched_getaffinity(0))
    assert env["OMP_NUM_THREADS"] == str(max(1, cpus // settings.worker_concurrency // 2))
    assert env["HALFCAST_RUN_NICE"] == "10"  # the run yields the CPU to the API and the worker by default


@pytest.mark.parametrize(
    ("cpus", "cpu_slots", "gpus", "ranks", "threads"),
    [
        (16, 2, 0, 2, 4),  # a CPU job: its slot's share of the cores (8), over its 2 ranks
        (16, 1, 0, 1, 16),  # one CPU slot: every core
        (64, 4, 0, 1, 16),
        (2, 3, 0, 1, 1),  # more slots than cores: still one thread
        (2, 2, 0, 2, 1),
        (16, 2, 2, 2, 8),  # a GPU job holds no CPU slot: its ranks share every core
    ],
)
def test_a_cpu_job_s_threads_are_its_slot_s_share_of_the_cores(
    cpus: int, cpu_slots: int, gpus: int, ranks: int, threads: int
) -> None:
    spec = JobSpec.model_validate(small_spec(processes=ranks, gpus=gpus))
    assert rank_threads(spec, cpu_slots, cpus) == threads


def test_a_run_starts_at_the_configured_niceness(tmp_path: Path) -> None:
    """``HALFCAST_RUN_NICE`` in the run's environment (``Settings.run_nice``) lowers the run's priority, and
    the worker's own stays as it was."""
    before = os.nice(0)
    env = {**build_environment(JobSpec.model_validate(small_spec()), Settings(data_dir=tmp_path, run_nice=5)), "X": ""}
    process = start_run([sys.executable, "-c", "import os; print('nice', os.nice(0))"], tmp_path, env)
    assert process.popen.wait(timeout=60) == 0
    assert f"nice {before + 5}" in log_tail(tmp_path / "logs" / "launcher.log")
    assert os.nice(0) == before


def test_gpu_jobs_see_exactly_their_allocated_devices(tmp_path: Path) -> None:
    spec = JobSpec.model_validate(small_spec(gpus=2))
    settings = Settings(data_dir=tmp_path)
    assert build_environment(spec, settings, {}, gpus=[5, 2])["CUDA_VISIBLE_DEVICES"] == "5,2"
    # the worker's own CUDA_VISIBLE_DEVICES is never passed on: only the allocation counts
    inherited = build_environment(spec, settings, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, gpus=[3, 1])
    assert inherited["CUDA_VISIBLE_DEVICES"] == "3,1"
    for wrong in ([], [3], [3, 3], [1, 2, 3]):
        with pytest.raises(ValueError, match="needs 2 GPU"):
            build_environment(spec, settings, {}, gpus=wrong)


STUBBORN_TREE = Path(__file__).with_name("stubborn_tree.py")


def _wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def test_stop_leaves_no_process_of_the_run(tmp_path: Path) -> None:
    process = start_run([sys.executable, str(STUBBORN_TREE)], tmp_path, {"PATH": os.environ["PATH"]})
    _wait_for(lambda: len(process.members()) >= 6)  # leader, 3 children, 2 grandchildren
    members = process.members()
    assert len({info.sid for info in members}) == 2  # the leader's session and the "rank's"
    assert os.getsid(0) not in {info.sid for info in members}  # the run leads its own session
    started = time.monotonic()
    assert process.stop(grace_s=0.5) is True
    assert time.monotonic() - started < 10
    assert all(not _alive(info.pid, info.start) for info in members)
    assert all(session_members(sid) == [] for sid in {info.sid for info in members})
    assert process.returncode is not None and process.returncode < 0
    assert "tree started" in log_tail(tmp_path / "logs" / "launcher.log")


def test_orphans_of_a_leader_that_exited_are_still_stopped(tmp_path: Path) -> None:
    """torchrun may die and leave its ranks (each in its own session) behind."""
    process = start_run([sys.executable, str(STUBBORN_TREE), "--exit"], tmp_path, {"PATH": os.environ["PATH"]})
    _wait_for(lambda: process.poll() is not None or len(process.members()) >= 6)
    _wait_for(lambda: process.poll() is not None)
    assert process.returncode == 0
    orphans = process.members()
    assert len(orphans) == 5 and all(info.ppid != process.pid for info in orphans)
    assert process.stop(grace_s=0.5) is True
    assert all(not _alive(info.pid, info.start) for info in orphans)


def _alive(pid: int, start: int) -> bool:
    info = read_proc(pid)
    return info is not None and info.alive and info.start == start


def test_stop_of_a_cooperative_run_needs_only_sigterm(tmp_path: Path) -> None:
    process = start_run([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path, {"PATH": os.environ["PATH"]})
    _wait_for(lambda: bool(process.members()))
    started = time.monotonic()
    assert process.stop(grace_s=30) is True
    assert time.monotonic() - started < 5
    assert process.returncode == -15


def test_the_run_is_told_when_it_was_launched(tmp_path: Path) -> None:
    """``HALFCAST_LAUNCHED_AT``: the trainer's start-up phases are timed from there (trainer/startup.py)."""
    before = time.time()
    code = "import os; print('launched at', os.environ['HALFCAST_LAUNCHED_AT'])"
    process = start_run([sys.executable, "-c", code], tmp_path, {"PATH": os.environ["PATH"]})
    _wait_for(lambda: process.poll() is not None)
    assert process.returncode == 0
    stamp = float(log_tail(process.log_path).rsplit("launched at ", 1)[1])
    assert before <= stamp <= time.time()


FORWARDING_LAUNCHER = Path(__file__).with_name("forwarding_launcher.py")


def _start_forwarding(tmp_path: Path, *extra: str):
    process = start_run(
        [sys.executable, str(FORWARDING_LAUNCHER), str(tmp_path), *extra], tmp_path, {"PATH": os.environ["PATH"]}
    )
    _wait_for(lambda: "started" in log_tail(tmp_path / "logs" / "launcher.log"))
    return process


def _senders(path: Path) -> list[int]:
    """The pids that sent the SIGTERMs recorded in ``path``."""
    return [int(line) for line in path.read_text().splitlines()]


def test_sigterm_goes_to_the_launcher_which_passes_it_on_to_its_ranks(tmp_path: Path) -> None:
    """torchrun passes SIGTERM on to its ranks and waits for them: the stop signals the launcher alone, once,
    and the rank gets SIGTERM from the launcher only; the stop ends as soon as the run has exited."""
    process = _start_forwarding(tmp_path)
    started = time.monotonic()
    assert process.stop(grace_s=30) is True
    assert time.monotonic() - started < 10  # the rank takes 0.5 s; nowhere near the grace
    assert _senders(tmp_path / "launcher-sigterms") == [os.getpid()]
    assert _senders(tmp_path / "rank-sigterms") == [process.pid]
    assert process.returncode == 143


def test_the_ranks_of_a_launcher_that_does_not_pass_sigterm_on_get_it_from_the_worker(tmp_path: Path) -> None:
    """A launcher that takes SIGTERM and keeps waiting: its rank is signalled directly, soon, not at the grace;
    the launcher, still handling its SIGTERM, gets no second one (torchrun would shut down twice)."""
    process = _start_forwarding(tmp_path, "--no-forward")
    started = time.monotonic()
    assert process.stop(grace_s=30) is True
    assert time.monotonic() - started < 10
    assert _senders(tmp_path / "launcher-sigterms") == [os.getpid()]
    assert _senders(tmp_path / "rank-sigterms") == [os.getpid()]
    assert process.returncode == 143  # it exited by itself once its rank had: no SIGKILL


def test_torchrun_stopped_by_a_signal_exits_128_plus_it_and_other_endings_are_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """worker.launch.torchrun: torchrun's ``SignalException`` (its ranks already stopped) is a stop, not a crash."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    import worker.launch.torchrun

    def stopped(argv: list[str]) -> None:
        raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)

    def crashed(argv: list[str]) -> None:
        raise RuntimeError("a rank failed")

    seen: list[list[str]] = []
    monkeypatch.setattr(worker.launch.torchrun, "torchrun_main", seen.append)
    assert worker.launch.torchrun.run(["--standalone", "-m", "trainer"]) == 0 and seen == [
        ["--standalone", "-m", "trainer"]
    ]
    monkeypatch.setattr(worker.launch.torchrun, "torchrun_main", stopped)
    assert worker.launch.torchrun.run([]) == 143
    monkeypatch.setattr(worker.launch.torchrun, "torchrun_main", crashed)
    with pytest.raises(RuntimeError, match="a rank failed"):
        worker.launch.torchrun.run([])


def test_start_of_a_missing_program_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        start_run([str(tmp_path / "no-such-program")], tmp_path, {})


def test_log_tail_keeps_the_last_lines(tmp_path: Path) -> None:
    path = tmp_path / "launcher.log"
    path.write_text("".join(f"line {i}\n" for i in range(200)))
    tail = log_tail(path, lines=50)
    assert tail.splitlines() == [f"line {i}" for i in range(150, 200)]
    assert log_tail(tmp_path / "absent.log") == ""


def test_members_sees_a_real_subprocess_session(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        _wait_for(lambda: bool(session_members(child.pid)))
        assert [info.pid for info in session_members(child.pid)] == [child.pid]
    finally:
        child.kill()
        child.wait()
    assert session_members(child.pid) == []


def test_a_process_whose_name_holds_spaces_and_parens_is_read_right(tmp_path: Path) -> None:
    """``/proc/<pid>/stat`` puts the command name in parentheses: one with ``) `` inside must not shift the fields."""
    sleeper = tmp_path / "a) b (c"
    sleeper.symlink_to(shutil.which("sleep") or "/bin/sleep")
    child = subprocess.Popen([str(sleeper), "30"])
    try:
        info = read_proc(child.pid)
        assert info is not None and info.pid == child.pid and info.ppid == os.getpid() and info.alive
        assert info.sid == os.getsid(0) and info.pgid == os.getpgid(0)
    finally:
        child.kill()
        child.wait()
    assert read_proc(child.pid) is None  # reaped: gone
