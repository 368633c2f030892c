"""Limits the API and its clients share, so a client refuses what the API would refuse before sending it."""

from __future__ import annotations

#: Largest accepted request body, in bytes, of any route but the uploads (a job spec is a few KiB).
MAX_BODY_BYTES = 1 << 20
