"""Halfcast's data directory as the CLI finds it without building :class:`halfcast.core.settings.Settings`.

The job commands need only the data directory (for the token file), and importing
pydantic-settings costs a fraction of a second each run. :func:`data_dir_from_environment`
reads ``HALFCAST_DATA_DIR`` the way ``Settings`` does (the name in any case) and resolves
it as ``Settings.resolved_data_dir`` does; ``Settings`` takes its default from here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: Where the embedded database, broker and run directories live unless ``HALFCAST_DATA_DIR`` says otherwise.
DEFAULT_DATA_DIR = Path(".halfcast")
#: The variable naming the data directory (matched without regard to case, like ``Settings``).
DATA_DIR_VARIABLE = "HALFCAST_DATA_DIR"


def data_dir_from_environment(environ: Mapping[str, str] | None = None) -> Path:
    """``HALFCAST_DATA_DIR`` of ``environ`` (default: ``os.environ``), else :data:`DEFAULT_DATA_DIR`, made absolute."""
    environ = os.environ if environ is None else environ
    wanted = DATA_DIR_VARIABLE.lower()
    value = next((text for name, text in environ.items() if name.lower() == wanted), None)
    return (DEFAULT_DATA_DIR if value is None else Path(value)).expanduser().resolve()
