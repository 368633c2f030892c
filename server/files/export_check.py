"""The check the trainer recorded for a merged export (``halfcast_export.json``'s ``check``), as the API lists it.

The file is written by training code, so it is read like any export file: only a regular file
(the export was walked without following links), at most :data:`MAX_METADATA_BYTES`, and a
``check`` that does not validate is no check (logged), never an error of the listing.
"""

from __future__ import annotations

import json
import logging

from pydantic import ValidationError

from halfcast.contracts.records import ExportCheck
from halfcast.files.export_files import Export

log = logging.getLogger(__name__)

#: The metadata file of an export directory (``trainer/hf/export_identity.py``).
METADATA_FILE = "halfcast_export.json"
#: Largest metadata file read.
MAX_METADATA_BYTES = 64 << 10


def recorded_check(export: Export) -> ExportCheck | None:
    """The export's recorded check, or ``None`` (none recorded, too large, or not valid)."""
    found = next((f for f in export.files if f.name == METADATA_FILE), None)
    if found is None or found.size_bytes > MAX_METADATA_BYTES:
        return None
    try:
        check = json.loads(found.path.read_bytes()).get("check")
        return None if check is None else ExportCheck.model_validate(check)
    except (OSError, ValueError, AttributeError, ValidationError) as exc:
        log.warning("export %s: unreadable check in %s: %s", export.path, METADATA_FILE, exc)
        return None
