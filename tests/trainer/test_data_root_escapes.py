"""Dataset paths cannot leave their data root: symlinks (to files, directories, /proc), special files.

Complements ``test_sources.py`` (absolute paths, ``..``, directories, empty files).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainer.data.sources import read_data_file, resolve_data_file
from trainer.errors import TrainerError


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A data root next to a secret file outside it."""
    (tmp_path / "secret.txt").write_bytes(b"secret")
    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "key.txt").write_bytes(b"secret")
    root = tmp_path / "root"
    root.mkdir()
    return root


def _refused(path: str, root: Path, match: str) -> None:
    with pytest.raises(TrainerError, match=match) as info:
        read_data_file(path, 100, [root])
    assert info.value.reason == "data_unavailable"


def test_a_symlink_to_a_file_outside_the_root_is_refused(root: Path) -> None:
    (root / "link.txt").symlink_to(root.parent / "secret.txt")
    _refused("link.txt", root, "leaves its data root")


def test_a_symlinked_directory_outside_the_root_is_refused(root: Path) -> None:
    (root / "sub").symlink_to(root.parent / "private", target_is_directory=True)
    _refused("sub/key.txt", root, "leaves its data root")


def test_a_relative_symlink_climbing_out_is_refused(root: Path) -> None:
    (root / "up.txt").symlink_to(Path("..") / "secret.txt")
    _refused("up.txt", root, "leaves its data root")


def test_a_symlink_into_proc_is_refused(root: Path) -> None:
    (root / "env").symlink_to(f"/proc/{os.getpid()}/environ")
    (root / "self").symlink_to("/proc/self", target_is_directory=True)
    _refused("env", root, "leaves its data root")
    _refused("self/environ", root, "leaves its data root")


def test_a_fifo_inside_the_root_is_not_read(root: Path) -> None:
    """A named pipe would block the reader forever: only regular files are data."""
    os.mkfifo(root / "pipe")
    _refused("pipe", root, "not a file under any data root")


@pytest.mark.parametrize("path", ["/proc/self/environ", "//etc/passwd", "./../secret.txt", "sub/./../../secret.txt"])
def test_absolute_and_climbing_spellings_are_refused(root: Path, path: str) -> None:
    with pytest.raises(TrainerError):
        resolve_data_file(path, [root])


def test_a_symlink_loop_is_not_a_file(root: Path) -> None:
    (root / "a").symlink_to(root / "b")
    (root / "b").symlink_to(root / "a")
    _refused("a", root, "not a file under any data root")
