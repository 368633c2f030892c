"""Where the CLI finds its API token, and how a token is written to a file.

The job commands send ``--token``, else ``HALFCAST_TOKEN``, else the contents of
``<data_dir>/token`` (``HALFCAST_DATA_DIR``, default ``.halfcast``): the file
``halfcast up`` writes on its first start, so the CLI on the same machine needs no
set-up. No token at all is fine for a server with authentication off.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from halfcast.core.data_dir import data_dir_from_environment

if TYPE_CHECKING:  # building Settings imports pydantic-settings, which the job commands do without
    from halfcast.core.settings import Settings

log = logging.getLogger(__name__)

#: Name of the token file in the data directory.
TOKEN_FILE = "token"


def token_path(settings: Settings | None = None) -> Path:
    """``<data_dir>/token`` of ``settings`` (default: of ``HALFCAST_DATA_DIR``)."""
    data_dir = data_dir_from_environment() if settings is None else settings.resolved_data_dir
    return data_dir / TOKEN_FILE


def resolve_token(explicit: str | None = None) -> str | None:
    """``explicit``, else ``HALFCAST_TOKEN``, else the token file's first line, else ``None``."""
    if explicit:
        return explicit.strip()
    if env := os.environ.get("HALFCAST_TOKEN", "").strip():
        return env
    path = token_path()
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot read the token file %s: %s", path, exc)
        return None
    return text.splitlines()[0] if text else None


def write_token_file(path: Path, secret: str, mode: int = 0o600) -> None:
    """Write ``secret`` and a newline to ``path`` (parents created), with permissions ``mode`` from the start.

    The file is created with ``mode`` (never readable by others in between) and
    replaces any older one. Raises ``OSError`` when it cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have narrowed or the file existed
        os.write(fd, (secret + "\n").encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
