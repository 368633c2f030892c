"""A job's stored spec (``jobs.spec``) read back as the validated :class:`~halfcast.contracts.spec.JobSpec`.

The column holds the submitted spec's ``model_dump(mode="json")``; what the API derives from it
(``nodes``, ``effective_precision``, ``loss_scaling`` of the job resource) is read from the
validated model, so the rules are :class:`JobSpec`'s own (``effective_loss_scale``), written once.

A spec never changes after its job is created, and validating one costs tens of microseconds
on every read of every job (a poller reads one job again and again; a list page up to 1000), so
the result is cached per job id in a bounded LRU (:class:`StoredSpecs`). An entry is used only
while the stored dict is still equal to the one it was made from (a cheap comparison, a small
fraction of a validation), so a reused id or a rewritten row is never answered from a stale entry.

A stored spec that no longer validates (stored by an older Halfcast whose rules have since
been tightened, or written by hand) is ``None``: a warning names the job and the failing fields
(once per cached entry, not on every read), nothing is raised, and the stored dict is not
touched. Callers show the stored dict as it is and derive nothing from it.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

from pydantic import ValidationError

from halfcast.contracts.spec import JobSpec

log = logging.getLogger(__name__)

#: Most specs kept: two full pages of ``GET /jobs`` (at most 1000 jobs each); about 7 KB each.
CACHE_SIZE = 2048


@dataclass(frozen=True)
class _Entry:
    stored: object
    spec: JobSpec | None


class StoredSpecs:
    """A bounded, thread-safe LRU of validated stored specs by job id (the API's routes run in threads)."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._size = size
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, job_id: str, stored: object) -> JobSpec | None:
        """The job's stored spec ``stored`` validated, from the cache when it holds this very spec."""
        with self._lock:
            entry = self._entries.get(job_id)
            if entry is not None and entry.stored == stored:
                self._entries.move_to_end(job_id)
                return entry.spec
        spec = validate_stored(job_id, stored)
        with self._lock:
            self._entries[job_id] = _Entry(stored, spec)
            self._entries.move_to_end(job_id)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return spec

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def validate_stored(job_id: str, stored: object) -> JobSpec | None:
    """``stored`` as a :class:`JobSpec`, or ``None`` (logged as a warning) when it does not validate."""
    try:
        return JobSpec.model_validate(stored)
    except ValidationError as exc:
        fields = ", ".join(".".join(map(str, error["loc"])) or "(spec)" for error in exc.errors())
        log.warning("job %s: its stored spec does not validate (%s); nothing is derived from it", job_id, fields)
        return None


#: The process's cache (:func:`stored_spec`).
SPECS = StoredSpecs()


def stored_spec(job_id: str, stored: object) -> JobSpec | None:
    """Job ``job_id``'s stored spec as a validated :class:`JobSpec`, cached; ``None`` if it does not validate."""
    return SPECS.get(job_id, stored)
