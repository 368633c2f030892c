"""A job's exported model directory copied into the registry's staging area, to be registered as a model.

Each file of the export (as :func:`halfcast.files.export_files.find_export` listed it: regular files only,
walked without following links) is hard-linked when the registry shares the runs directory's
filesystem (no copy of multi-GB weights; a run never changes its export once written), else copied,
opened with ``O_NOFOLLOW``. The copy is checked again as an upload is (:mod:`.model_check`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from halfcast.files.export_files import Export


def _copy_file(source: Path, target: Path) -> None:
    descriptor = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(descriptor, "rb") as reader, target.open("xb") as writer:
        shutil.copyfileobj(reader, writer, 1 << 20)


def copy_export(export: Export, into: Path) -> None:
    """Put the files of ``export`` under the new directory ``into`` (hard links where possible)."""
    into.mkdir()
    for file in export.files:
        target = into / file.name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(file.path, target, follow_symlinks=False)
        except OSError:  # another filesystem, or links not allowed there
            _copy_file(file.path, target)
