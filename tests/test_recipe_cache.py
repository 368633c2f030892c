"""tests/recipe_cache.py: a recipe is built once per key, copies are the test's own, a changed recipe builds anew."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import recipe_cache
from recipe_cache import CACHE_ENV, built, copy_built

BUILDS: list[int] = []


def _write(directory: Path, seed: int) -> None:
    BUILDS.append(seed)
    (directory / "weights.txt").write_text(f"seed {seed}")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    BUILDS.clear()


def test_a_recipe_is_built_once_and_each_copy_is_the_callers_own(tmp_path: Path) -> None:
    first = copy_built("toy", _write, tmp_path / "a", seed=1)
    second = copy_built("toy", _write, tmp_path / "b", seed=1)
    assert BUILDS == [1]
    assert (first / "weights.txt").read_text() == (second / "weights.txt").read_text() == "seed 1"
    (first / "weights.txt").write_text("changed by a test")
    assert (built("toy", _write, seed=1) / "weights.txt").read_text() == "seed 1"


def test_other_parameters_or_source_build_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    one, two = built("toy", _write, seed=1), built("toy", _write, seed=2)
    assert one != two and BUILDS == [1, 2]
    monkeypatch.setattr(recipe_cache.inspect, "getsource", lambda module: "an edited recipe")
    assert built("toy", _write, seed=1) != one and BUILDS == [1, 2, 1]


def test_workers_asking_at_once_share_one_build() -> None:
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(built("toy", _write, seed=3))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert BUILDS == [3] and len(set(results)) == 1


def test_a_failed_build_leaves_nothing_behind() -> None:
    def broken(directory: Path) -> None:
        (directory / "half.txt").write_text("half")
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError):
        built("broken", broken)
    assert [p.name for p in recipe_cache.cache_root().iterdir() if not p.name.endswith(".lock")] == []
