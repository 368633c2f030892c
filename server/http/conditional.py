"""Conditional requests on downloaded files: ``If-None-Match`` against the file's ``ETag`` (RFC 9110, 13.1.2).

A client that already holds a checkpoint sends its ``ETag`` back; when it still names
the file, the answer is ``304 Not Modified`` with no body instead of the file again.
The comparison is the weak one the RFC asks for on ``If-None-Match`` (``W/"x"`` matches
``"x"``), and ``*`` matches any file.
"""

from __future__ import annotations

from starlette.responses import Response

#: Headers of the full answer that a 304 repeats: the validator, and which attempt and step the file is.
NOT_MODIFIED_HEADERS = ("etag", "x-halfcast-attempt", "x-halfcast-step")


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """Whether the ``If-None-Match`` header value names ``etag`` (weakly), or is ``*``."""
    if if_none_match is None:
        return False
    if if_none_match.strip() == "*":
        return True
    wanted = etag.strip().removeprefix("W/")
    return any(tag.strip().removeprefix("W/") == wanted for tag in if_none_match.split(","))


def not_modified(full: Response) -> Response:
    """The ``304`` standing for ``full``: no body, and its :data:`NOT_MODIFIED_HEADERS`."""
    headers = {name: full.headers[name] for name in NOT_MODIFIED_HEADERS if name in full.headers}
    return Response(status_code=304, headers=headers)
