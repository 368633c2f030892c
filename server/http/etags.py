"""Strong entity tags of the job resource, and ``If-None-Match`` (RFC 9110 §8.8.3, §13.1.2).

A job's tag is a hash of everything its resource is built from: the columns and
attempts of :class:`server.db.job_reads.JobView` (status, step, ``latest``, ``eval``,
error, timestamps, precision switches, every attempt, the spec...), plus the
resource's JSON schema and :data:`REPRESENTATION`, so the same tag always means the
same bytes and any change to any field, or to how the resource is written, gives a
new tag. It is computed from the row before any rendering: a poller whose tag is
current gets ``304 Not Modified`` without the resource being built.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache

from server.db.job_reads import JobView
from server.schemas import JobPublic

#: Changed whenever the same row would be rendered to different JSON (the schema hash covers new fields).
REPRESENTATION = "job/1"


@cache
def _schema_tag() -> str:
    """A short hash of the job resource's JSON schema (computed once, on first use)."""
    schema = json.dumps(JobPublic.model_json_schema(), sort_keys=True)
    return hashlib.blake2b(schema.encode(), digest_size=8).hexdigest()


def job_etag(job: JobView) -> str:
    """The strong ``ETag`` of ``job``'s resource, quoted: ``"<32 hex digits>"``."""
    material = repr((REPRESENTATION, _schema_tag(), job))
    return f'"{hashlib.blake2b(material.encode(), digest_size=16).hexdigest()}"'


def none_match(if_none_match: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header matches ``etag`` (``*`` or any listed tag; ``W/`` ignored, as GET compares weakly)."""
    if if_none_match is None:
        return False
    if if_none_match.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in if_none_match.split(","))
