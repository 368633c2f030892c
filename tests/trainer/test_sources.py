"""Text sources: the standard library walk and the data-root containment rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from halfcast.contracts.catalog import TextConfig
from trainer.data.sources import read_data_file, read_stdlib, resolve_data_file, stdlib_python_files
from trainer.errors import TrainerError


def test_stdlib_walk_is_sorted_and_skips_third_party(tmp_path: Path) -> None:
    for name in ("b.py", "a.py", "notes.txt", "pkg/z.py", "pkg/c.py", "site-packages/evil.py"):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {name}\n")
    files = [p.relative_to(tmp_path).as_posix() for p in stdlib_python_files(tmp_path)]
    assert files == ["a.py", "b.py", "pkg/c.py", "pkg/z.py"]
    assert read_stdlib(9, tmp_path) == b"# a.py\n# "


def test_real_stdlib_is_non_empty_and_deterministic() -> None:
    first = read_stdlib(50_000)
    assert len(first) == 50_000 and first == read_stdlib(50_000)
    assert b"def " in first or b"import " in first


def test_empty_stdlib_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(TrainerError) as info:
        read_stdlib(100, tmp_path)
    assert info.value.reason == "data_unavailable"


def test_data_file_found_in_a_later_root(tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    (second / "d").mkdir(parents=True)
    (second / "d" / "f.txt").write_bytes(b"abcdef")
    assert resolve_data_file("d/f.txt", [first, second]) == (second / "d" / "f.txt").resolve()
    assert read_data_file("d/f.txt", 4, [first, second]) == b"abcd"


def test_symlinks_inside_the_root_are_allowed(tmp_path: Path) -> None:
    (tmp_path / "real.txt").write_bytes(b"data")
    (tmp_path / "alias.txt").symlink_to(tmp_path / "real.txt")
    assert read_data_file("alias.txt", 100, [tmp_path]) == b"data"


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../outside.txt", "a/../../outside.txt", "dir/../inside.txt", "dir", "empty.txt"]
)
def test_bad_paths_are_data_unavailable(tmp_path: Path, path: str) -> None:
    """Absolute paths and any '..' (even one that stays inside) are refused, as are directories and empty files."""
    root = tmp_path / "root"
    (root / "dir").mkdir(parents=True)
    (root / "empty.txt").write_bytes(b"")
    (root / "inside.txt").write_bytes(b"fine")
    (tmp_path / "outside.txt").write_bytes(b"secret")
    with pytest.raises(TrainerError) as info:
        read_data_file(path, 100, [root])
    assert info.value.reason == "data_unavailable"


def test_no_roots_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HALFCAST_DATA_ROOTS", raising=False)
    with pytest.raises(TrainerError, match="no data roots"):
        resolve_data_file("a.txt")


def test_file_source_without_path_is_a_spec_error() -> None:
    with pytest.raises(ValidationError, match="needs a path"):
        TextConfig(source="file")
