"""Warm start (worker/warm): a standby forks a CPU job's ranks; the run is the cold run's, step for step.

One standby per test module is expensive (torch, the trainer, scikit-learn, transformers
imported: seconds), so the module shares one pool: its standby forks every run's launcher
and stays (worker/warm/forkserver.py).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from worker_support import small_spec

from halfcast.contracts.rundir import JobRuns, RunDir
from halfcast.contracts.spec import JobSpec
from halfcast.core.settings import Settings
from worker.gang.launch import NodePlan, gang_command, node_environment
from worker.gang.plan import GangLauncher
from worker.launch.process_tree import RunProcess, build_command, build_environment, start_run
from worker.lifecycle.failure_logs import root_cause
from worker.warm.agent import rank_environment
from worker.warm.assignment import GangSeat, WarmCommand, warm_command_parts
from worker.warm.pool import WarmPool, standby_environment

READY_WAIT_S = 180.0
#: The pool's niceness (``Settings.run_nice``): the standby's, which its launchers and ranks inherit.
RUN_NICE = 3
RUN_WAIT_S = 180.0
LOOPBACK = "127.0.0.1"


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmPool]:
    shutdown = threading.Event()
    warm = WarmPool(tmp_path_factory.mktemp("warm"), shutdown, nice=RUN_NICE)
    warm.start()
    yield warm
    shutdown.set()


def _standby_ready(pool: WarmPool) -> None:
    deadline = time.monotonic() + READY_WAIT_S
    while pool._ready is None:
        assert time.monotonic() < deadline, "no warm standby became ready"
        time.sleep(0.1)


def _launch(tmp_path: Path, spec: dict[str, Any], attempt: int, pool: WarmPool | None) -> tuple[Path, RunProcess]:
    run_dir = JobRuns.of(tmp_path / "runs", "job").attempt(attempt).path
    run_dir.mkdir(parents=True)
    job = JobSpec.model_validate(spec)
    RunDir(run_dir).spec.write_text(job.model_dump_json())
    env = build_environment(job, Settings(data_dir=tmp_path, allow_faults=True))
    command = build_command(job, RunDir(run_dir).spec, run_dir)
    if pool is None:
        return run_dir, start_run(command, run_dir, env)
    _standby_ready(pool)
    return run_dir, pool.start_run(command, run_dir, env)


def _wait(process: RunProcess) -> int:
    deadline = time.monotonic() + RUN_WAIT_S
    while (code := process.poll()) is None:
        assert time.monotonic() < deadline, "the run did not finish"
        time.sleep(0.05)
    return code


def _niceness(pid: int) -> int:
    """The niceness of ``pid`` (``/proc/<pid>/stat``, field 19)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in RunDir(run_dir).records.read_text().splitlines()]
    return [
        {k: r[k] for k in ("step", "loss", "loss_scale", "skipped") if k in r} for r in records if r["type"] == "step"
    ]


def test_only_trainer_commands_take_the_warm_path(tmp_path: Path) -> None:
    job = JobSpec.model_validate(small_spec(processes=2))
    command = build_command(job, tmp_path / "spec.json", tmp_path)
    parts = warm_command_parts(command)
    assert parts == WarmCommand(
        2, RunDir(tmp_path).logs, ("--spec", str(tmp_path / "spec.json"), "--run-dir", str(tmp_path))
    )
    assert warm_command_parts(build_command(job, tmp_path / "spec.json", tmp_path, module="rank_echo")) is None
    assert warm_command_parts([*command[:3], "--nnodes", "2", *command[5:]]) is None  # no rendezvous: cold
    assert warm_command_parts(["python", "fake_trainer.py", "--spec", "s"]) is None


def test_a_gang_node_s_command_takes_the_warm_path_with_its_seat(tmp_path: Path) -> None:
    job = JobSpec.model_validate(small_spec(processes=2, nodes=3))
    plan = NodePlan("job", 2, 1, 3, "fd00::1", 29555, "fd00::2")
    parts = warm_command_parts(gang_command(job, tmp_path / "spec.json", tmp_path, plan))
    seat = GangSeat(nodes=3, node_rank=1, endpoint_host="fd00::1", endpoint_port=29555, run_id="job-2")
    assert parts == WarmCommand(
        2, RunDir(tmp_path).logs, ("--spec", str(tmp_path / "spec.json"), "--run-dir", str(tmp_path)), seat
    )
    other = gang_command(job, tmp_path / "spec.json", tmp_path, plan)
    other[other.index("--rdzv-backend") + 1] = "c10d"
    assert warm_command_parts(other) is None  # only the static rendezvous (node 0 hosts the store) is warm
    assert warm_command_parts(gang_command(job, tmp_path / "s", tmp_path, plan, module="rank_echo")) is None
    with pytest.raises(ValidationError):
        GangSeat(nodes=2, node_rank=2, endpoint_host="h", endpoint_port=1, run_id="r")


def test_a_gang_node_s_ranks_get_torchrun_s_global_ranks_and_node_0_s_endpoint() -> None:
    seat = GangSeat(nodes=2, node_rank=1, endpoint_host="10.0.0.1", endpoint_port=29555, run_id="job-2")
    rank = rank_environment({}, 1, 3, "r", seat)
    keys = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RUN_ID")
    assert {k: rank[k] for k in keys} == {
        "RANK": "4",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "1",
        "WORLD_SIZE": "6",
        "LOCAL_WORLD_SIZE": "3",
        "MASTER_ADDR": "10.0.0.1",
        "TORCHELASTIC_RUN_ID": "job-2",
    }


def test_the_standby_has_one_thread_no_gpu_and_ranks_get_torchrun_s_environment() -> None:
    env = standby_environment({"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0", "HALFCAST_DATABASE_URL": "x"})
    assert (env["CUDA_VISIBLE_DEVICES"], env["OMP_NUM_THREADS"], env["PATH"]) == ("", "1", "/bin")
    assert "HALFCAST_DATABASE_URL" not in env
    rank = rank_environment({"OMP_NUM_THREADS": "4"}, 1, 2, "r")
    assert {
        k: rank[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE")
    } == {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }  # the launcher hosts the store: rank 0 does not bind a port of its own
    assert rank["OMP_NUM_THREADS"] == "4"


@pytest.mark.slow
@pytest.mark.parametrize("launcher", list(GangLauncher))
def test_a_gang_of_two_nodes_on_one_host_is_the_one_node_run_step_for_step(
    tmp_path: Path, pool: WarmPool, launcher: GangLauncher
) -> None:
    """Node 0 and node 1 of a gang (one rank each) on the loopback address, launched as node 0 chose
    (:mod:`worker.gang.plan`): both forked from the module's standby, node 0's launcher hosting the store at the
    gang's endpoint, or both by torchrun's static rendezvous (cold: about 10 s). Against the warm run of the same
    job on one node of two ranks: the same steps, bit for bit (on separate hosts: tests/e2e/test_multi_node.py)."""
    spec = small_spec(processes=2, max_steps=4, log_interval=1, precision="fp16")
    one_dir, one = _launch(tmp_path / "one", spec, 1, pool)
    job = JobSpec.model_validate({**spec, "processes": 1, "nodes": 2})
    run_dir = JobRuns.of(tmp_path / "gang", "job").attempt(1).path
    run_dir.mkdir(parents=True)
    RunDir(run_dir).spec.write_text(job.model_dump_json())
    env = node_environment(build_environment(job, Settings(data_dir=tmp_path, allow_faults=True)), LOOPBACK)
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        port = probe.getsockname()[1]
    nodes = []
    for node_rank in (0, 1):
        command = gang_command(
            job, RunDir(run_dir).spec, run_dir, NodePlan("job", 1, node_rank, 2, LOOPBACK, port, LOOPBACK)
        )
        node_dir = run_dir / "nodes" / f"node-{node_rank}"
        if launcher == GangLauncher.WARM:
            nodes.append((node_dir, pool.start_run(command, node_dir, env, warm_only=True)))
        else:
            nodes.append((node_dir, start_run(command, node_dir, env)))
    for node_dir, node in nodes:
        assert _wait(node) == 0, RunDir(node_dir).launcher_log.read_text()
    assert _wait(one) == 0, RunDir(one_dir).launcher_log.read_text()
    assert len(_steps(run_dir)) == 4
    assert _steps(run_dir) == _steps(one_dir)
    for rank in (0, 1):
        log_text = RunDir(run_dir).rank_log(rank).read_text()
        assert f"rank={rank} world_size=2 node_rank={rank}" in log_text
        assert ("forked from a warm standby" in log_text) == (launcher == GangLauncher.WARM)


def test_a_run_that_must_start_warm_never_starts_cold(tmp_path: Path) -> None:
    """A node of a warm gang (``warm_only``) with no standby ready: ``OSError``, no process started."""
    job = JobSpec.model_validate(small_spec(processes=1, nodes=2))
    command = gang_command(job, tmp_path / "spec.json", tmp_path, NodePlan("job", 1, 1, 2, LOOPBACK, 29999, LOOPBACK))
    idle = WarmPool(tmp_path / "never-started", threading.Event())
    with pytest.raises(OSError, match="must start warm"):
        idle.start_run(command, tmp_path / "node-1", {}, warm_only=True)
    assert idle.wait_ready(0.2, lambda: None) is None


@pytest.mark.slow
def test_a_warm_run_is_the_cold_run_step_for_step(tmp_path: Path, pool: WarmPool) -> None:
    spec = small_spec(processes=2, max_steps=6, log_interval=1, precision="fp16")
    cold_dir, cold = _launch(tmp_path / "cold", spec, 1, None)
    warm_dir, warm = _launch(tmp_path / "warm", spec, 1, pool)
    assert _wait(warm) == 0, RunDir(warm_dir).launcher_log.read_text()
    assert _wait(cold) == 0, RunDir(cold_dir).launcher_log.read_text()
    assert len(_steps(warm_dir)) == 6
    assert _steps(warm_dir) == _steps(cold_dir)  # losses, scales and skips, bit for bit
    for rank in (0, 1):
        assert "forked from a warm standby" in RunDir(warm_dir).rank_log(rank).read_text()
    start = next(json.loads(line) for line in RunDir(warm_dir).records.read_text().splitlines() if '"start"' in line)
    assert start["startup"]["launch_s"] is not None and start["startup"]["imports_s"] is not None
    assert not warm.members()  # nothing of the run is left


@pytest.mark.slow
def test_a_stopped_warm_run_checkpoints_and_leaves_no_process(tmp_path: Path, pool: WarmPool) -> None:
    spec = small_spec(processes=2, max_steps=100_000, log_interval=1, faults={"sleep_per_step_s": 0.05})
    run_dir, process = _launch(tmp_path, spec, 1, pool)
    deadline = time.monotonic() + RUN_WAIT_S
    while not (RunDir(run_dir).records.exists() and '"step"' in RunDir(run_dir).records.read_text()):
        assert process.poll() is None, RunDir(run_dir).launcher_log.read_text()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    titles = [Path(f"/proc/{info.pid}/cmdline").read_bytes() for info in process.members()]
    assert len(titles) == 3 and all(str(run_dir).encode() in title for title in titles), titles  # ps names the job
    assert sum(b"MASTER_PORT=" in title for title in titles) == 3
    assert {_niceness(info.pid) for info in process.members()} == {os.nice(0) + RUN_NICE}  # the launcher, the ranks
    assert process.stop(grace_s=30.0)
    assert process.returncode == 128 + signal.SIGTERM
    assert list(RunDir(run_dir).checkpoints.glob("*")), "the stop wrote no checkpoint"
    assert "stopped by SIGTERM" in RunDir(run_dir).launcher_log.read_text()


@pytest.mark.slow
def test_a_failed_rank_stops_the_others_and_is_named_as_the_root_cause(tmp_path: Path, pool: WarmPool) -> None:
    spec = small_spec(processes=2, max_steps=100_000, faults={"kill_at_step": {"step": 2, "rank": 1}})
    run_dir, process = _launch(tmp_path, spec, 1, pool)
    assert _wait(process) == 1
    cause = root_cause(RunDir(run_dir).launcher_log.read_text())
    assert cause is not None and (cause.rank, cause.exitcode) == (1, -signal.SIGKILL)
    assert not process.members()
    assert os.path.exists(RunDir(run_dir).rank_log(0))


@pytest.mark.slow
def test_one_standby_forks_runs_one_after_another_and_at_once(tmp_path: Path, pool: WarmPool) -> None:
    """The imports are paid once per worker: the same standby forks a launcher per run and stays ready.

    Two runs at once and a third after them are all warm (their ranks say so), each launcher is a new
    process in a session of its own, and each exit status is the launcher's own.
    """
    _standby_ready(pool)
    standby = pool.ready()
    assert standby is not None
    spec = small_spec(processes=2, max_steps=3)
    runs = [_launch(tmp_path / name, spec, 1, pool) for name in ("first", "second")]
    for _, process in runs:  # a launcher leads its own session before its pid is handed back: never the standby's
        assert standby.popen.pid not in {info.pid for info in process.members()}
    assert _niceness(standby.popen.pid) == os.nice(0) + RUN_NICE  # the runs it forks inherit it (the stop test)
    failing = small_spec(processes=2, max_steps=100_000, faults={"kill_at_step": {"step": 2, "rank": 1}})
    assert [_wait(process) for _, process in runs] == [0, 0]
    runs.append(_launch(tmp_path / "third", failing, 1, pool))
    assert _wait(runs[2][1]) == 1  # the launcher's own status: a rank failed
    assert pool.ready() is standby and standby.alive()
    pids = {process.pid for _, process in runs}
    assert len(pids) == 3 and standby.popen.pid not in pids
    for run_dir, _ in runs:
        assert "forked from a warm standby" in RunDir(run_dir).rank_log(0).read_text()


@pytest.mark.slow
def test_a_run_whose_standby_dies_is_stopped_and_a_new_standby_starts(tmp_path: Path, pool: WarmPool) -> None:
    """SIGKILL on the standby: its launcher gets the death signal and stops the ranks (a stop checkpoint, no
    process left); the worker, with no exit report, counts it stopped by that signal, and a new standby starts."""
    _standby_ready(pool)
    standby = pool.ready()
    assert standby is not None
    spec = small_spec(processes=2, max_steps=100_000, log_interval=1, faults={"sleep_per_step_s": 0.05})
    run_dir, process = _launch(tmp_path, spec, 1, pool)
    deadline = time.monotonic() + RUN_WAIT_S
    while not (RunDir(run_dir).records.exists() and '"step"' in RunDir(run_dir).records.read_text()):
        assert process.poll() is None and time.monotonic() < deadline, RunDir(run_dir).launcher_log.read_text()
        time.sleep(0.05)
    standby.popen.kill()
    assert _wait(process) == 128 + signal.SIGTERM
    deadline = time.monotonic() + RUN_WAIT_S
    while process.members():
        assert time.monotonic() < deadline, process.members()
        time.sleep(0.05)
    assert "stopped by SIGTERM" in RunDir(run_dir).launcher_log.read_text()
    _standby_ready(pool)
    deadline = time.monotonic() + READY_WAIT_S
    while pool.ready() in (None, standby):
        assert time.monotonic() < deadline, "no new standby"
        time.sleep(0.1)
