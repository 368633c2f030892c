"""bench/cpu_roles.py: a host's CPU split by role, from process ancestry and names."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.cpu_roles import Reading, Role, RoleMap, cpu_by_pid


def _reading(cpu_s: dict[int, float], parent: dict[int, int], name: dict[int, str], wall_s: float) -> Reading:
    return Reading(cpu_s=cpu_s, parent=parent, name=name, wall_s=wall_s)


def test_each_process_gets_the_role_of_its_nearest_rooted_ancestor() -> None:
    # 1 init; 10 the bench, 11 its poller, 20 the API (the bench's child), 21 its thread pool child;
    # 30 the worker (the bench's child), 31 torchrun, 32 a rank; 40 a postgres backend; 50 something else.
    parent = {10: 1, 11: 10, 20: 10, 21: 20, 30: 10, 31: 30, 32: 31, 40: 1, 50: 1}
    name = {40: "postgres", 50: "sshd"}
    before = _reading({pid: 0.0 for pid in parent}, parent, name, wall_s=100.0)
    after = _reading(
        {10: 0.1, 11: 0.4, 20: 1.0, 21: 0.2, 30: 0.3, 31: 0.1, 32: 3.5, 40: 0.6, 50: 0.2}, parent, name, 102.0
    )
    cores = RoleMap(api=20, worker=30, bench=10).split(before, after)
    assert cores == {
        Role.API: 0.6,
        Role.WORKER: 0.15,
        Role.RUNS: 1.8,
        Role.POSTGRES: 0.3,
        Role.LOAD: 0.25,
        Role.OTHER: 0.1,
    }


def test_a_process_started_inside_the_window_counts_from_zero_and_a_cycle_ends() -> None:
    parent = {5: 6, 6: 5, 7: 1}  # a (corrupt) cycle must not hang the walk
    before = _reading({}, parent, {}, wall_s=0.0)
    after = _reading({5: 1.0, 6: 0.0, 7: 2.0}, parent, {}, wall_s=1.0)
    cores = RoleMap(api=7, bench=99).split(before, after)
    assert cores[Role.API] == 2.0 and cores[Role.OTHER] == 1.0


def test_a_real_busy_child_is_counted_under_its_role() -> None:
    code = "import time\nend = time.time() + 5\nwhile time.time() < end: pass"
    busy = subprocess.Popen([sys.executable, "-c", code])
    try:
        before = cpu_by_pid()
        time.sleep(0.8)
        after = cpu_by_pid()
    finally:
        busy.kill()
        busy.wait()
    cores = RoleMap(api=busy.pid, bench=os.getpid()).split(before, after)
    assert cores[Role.API] > 0, cores  # its share of a busy host: some, however small
