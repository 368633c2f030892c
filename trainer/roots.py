"""Worker-configured roots a job may read from: one containment rule for data and models.

A root list comes from an environment variable the worker sets for the trainer
(``HALFCAST_DATA_ROOTS``, ``HALFCAST_MODEL_ROOTS``: entries separated by ``os.pathsep``).
A job names a path *relative* to a root; it is found in the first root that holds it,
after following symlinks, and refused when its real location leaves that root.
Torch-free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Literal

from halfcast.contracts.status import FailureReason
from trainer.errors import TrainerError

Kind = Literal["file", "dir"]


@dataclass(frozen=True)
class RootSet:
    """Where a kind of input may come from: the ``env`` variable, the failure ``reason`` and a ``what`` for messages."""

    env: str
    reason: FailureReason
    what: str
    root_name: str

    def roots(self) -> list[Path]:
        """The configured roots (empty entries ignored)."""
        raw = os.environ.get(self.env, "")
        return [Path(entry) for entry in raw.split(os.pathsep) if entry]

    def resolve(self, relative: str, roots: list[Path] | None = None, kind: Kind = "file") -> Path:
        """The real path of ``relative`` inside the first root holding it as a ``kind`` (regular file or directory).

        Raises :class:`TrainerError` (``self.reason``) for an absolute path, a ``..``
        component, no configured roots, a real location (after symlinks) outside its
        root, or no root holding it.
        """
        candidate = PurePath(relative)
        if candidate.is_absolute() or candidate.anchor:
            raise TrainerError(self.reason, f"{self.what} path {relative!r} must be relative to a {self.root_name}")
        if ".." in candidate.parts:
            raise TrainerError(self.reason, f"{self.what} path {relative!r} must not contain '..'")
        roots = self.roots() if roots is None else roots
        if not roots:
            raise TrainerError(self.reason, f"no {self.root_name}s are configured ({self.env} is empty)")
        for root in roots:
            found = self._inside(root, candidate, kind)
            if found is not None:
                return found
        noun = "file" if kind == "file" else "directory"
        raise TrainerError(self.reason, f"{self.what} {noun} {relative!r} is not a {noun} under any {self.root_name}")

    def _inside(self, root: Path, relative: PurePath, kind: Kind) -> Path | None:
        """The resolved path when it exists under ``root`` as ``kind``; raises on a symlink escape."""
        try:
            real_root = root.resolve(strict=True)
            real = (real_root / relative).resolve(strict=True)
        except (OSError, RuntimeError):
            return None
        if not real.is_relative_to(real_root):
            raise TrainerError(self.reason, f"{self.what} path {str(relative)!r} leaves its {self.root_name}")
        matches = real.is_file() if kind == "file" else real.is_dir()
        return real if matches else None


DATA_ROOTS = RootSet(
    env="HALFCAST_DATA_ROOTS", reason=FailureReason.DATA_UNAVAILABLE, what="dataset", root_name="data root"
)
MODEL_ROOTS = RootSet(
    env="HALFCAST_MODEL_ROOTS", reason=FailureReason.MODEL_UNAVAILABLE, what="model", root_name="model root"
)
