"""Strong entity tags of the job resource, and ``If-None-Match`` (RFC 9110 §8.8.3, §13.1.2).

A job's tag is a hash of everything its resource is built from: the columns and
attempts of :class:`halfcast.core.db.job_reads.JobView` (status, step, ``latest``, ``eval``,
error, timestamps, precision switches, every attempt, the spec...), plus the
resource's JSON schema and :data:`REPRESENTATION`, so the same tag always means the
same bytes and any change to any field, or to how the resource is written, gives a
new tag. It is computed from the row before any rendering: a poller whose tag is
current gets ``304 Not Modified`` without the resource being built.

The hashed material is every field of the view, and of each of its attempts and
gang memberships, taken by name from the dataclasses' own field lists (a field
added to a view is covered without a change here), written with :mod:`marshal`
(format 2: no back-references, so equal values give equal bytes; decodable, so
different values give different bytes); datetimes go in as ``(isoformat,)``. That
is several times cheaper than the ``repr`` of the nested dataclasses, which ran
Python code per field and wrote every float in decimal. A value marshal cannot
write (none of the columns' types today) falls back to its ``repr``.
"""

from __future__ import annotations

import hashlib
import json
import marshal
from dataclasses import fields
from datetime import datetime
from functools import cache
from operator import attrgetter
from typing import Any

from halfcast.core.db.job_reads import AttemptView, JobView, MemberView
from server.schemas import JobPublic

#: Changed whenever the same row would be rendered to different JSON (the schema hash covers new fields).
REPRESENTATION = "job/1"


@cache
def _schema_tag() -> str:
    """A short hash of the job resource's JSON schema (computed once, on first use)."""
    schema = json.dumps(JobPublic.model_json_schema(), sort_keys=True)
    return hashlib.blake2b(schema.encode(), digest_size=8).hexdigest()


#: The fields of each view, in their declared order (``attempts`` and ``members`` of a job are taken apart below).
_NESTED = ("attempts", "members")
_JOB_FIELDS = attrgetter(*(f.name for f in fields(JobView) if f.name not in _NESTED))
_ATTEMPT_FIELDS = attrgetter(*(f.name for f in fields(AttemptView)))
_MEMBER_FIELDS = attrgetter(*(f.name for f in fields(MemberView)))
#: marshal's format without back-references (3 and later refer back to objects seen before, by identity).
_MARSHAL_VERSION = 2


def _values(row: tuple[Any, ...]) -> list[Any]:
    """The values of a view's fields, datetimes as ``(isoformat,)`` (marshal writes none)."""
    return [(value.isoformat(),) if isinstance(value, datetime) else value for value in row]


def _material(job: JobView) -> bytes:
    """Bytes that determine every field the resource is built from (see the module's docstring)."""
    values = (
        REPRESENTATION,
        _schema_tag(),
        _values(_JOB_FIELDS(job)),
        [_values(_ATTEMPT_FIELDS(attempt)) for attempt in job.attempts],
        [_values(_MEMBER_FIELDS(member)) for member in job.members],
    )
    try:
        return marshal.dumps(values, _MARSHAL_VERSION)
    except ValueError:  # a value of a type marshal does not write
        return repr((REPRESENTATION, _schema_tag(), job)).encode()


def job_etag(job: JobView) -> str:
    """The strong ``ETag`` of ``job``'s resource, quoted: ``"<32 hex digits>"``."""
    return f'"{hashlib.blake2b(_material(job), digest_size=16).hexdigest()}"'


def none_match(if_none_match: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header matches ``etag`` (``*`` or any listed tag; ``W/`` ignored, as GET compares weakly)."""
    if if_none_match is None:
        return False
    if if_none_match.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in if_none_match.split(","))
