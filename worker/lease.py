"""The lease an attempt holds on its job, renewed by the supervising thread's heartbeat.

The claim takes the lease (``worker.store.JobStore.claim``). :meth:`Lease.renew_if_due`
is called from the supervision loop (and while a run is being stopped); every
``ttl / RENEWALS_PER_TTL`` seconds it pushes ``lease_expires_at`` one ``ttl`` ahead,
fenced by attempt and owner. The lease is *lost* when

- the renewal updates no row: the job was recovered by a reaper, or ended, so this
  attempt must stop its run and write nothing more; or
- renewals keep failing (database unreachable) until the lease, as far as this
  worker knows, has expired: a reaper may already have taken the job over, so the
  attempt stops its run rather than risk two runs of one job (self-fencing).

Expiry is judged on this worker's monotonic clock from the start of the last
successful renewal (so it is no later than the expiry that renewal wrote), or from
the start of the attempt before the first renewal.
Workers compare ``lease_expires_at`` with their own UTC clocks: keep hosts'
clocks synchronised (NTP) to well within the lease length.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from worker.store import Fence, JobStore

log = logging.getLogger(__name__)

#: Renewals per lease length: the lease survives this many minus one missed heartbeats.
RENEWALS_PER_TTL = 5
#: Seconds between retries of a renewal that failed with an error.
RETRY_S = 1.0


class Lease:
    """The lease of one claimed attempt (taken by the claim at ``clock()`` time of construction)."""

    def __init__(
        self, store: JobStore, fence: Fence, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.fence = fence
        self.ttl_s = ttl_s
        self.clock = clock
        now = clock()
        self.valid_until = now + ttl_s
        self.next_renewal = now + ttl_s / RENEWALS_PER_TTL
        self.lost_reason: str | None = None

    @property
    def lost(self) -> bool:
        """Whether the attempt no longer owns its job (it must stop its run and write nothing)."""
        return self.lost_reason is not None

    def mark_lost(self, reason: str) -> None:
        """Record that the job is no longer this attempt's (e.g. a fenced write matched no row)."""
        if self.lost_reason is None:
            log.warning("job %s: attempt %d lost its lease: %s", self.fence.job_id, self.fence.attempt, reason)
            self.lost_reason = reason

    def renew_if_due(self) -> bool:
        """Renew the lease when a renewal is due; return whether the lease is still held."""
        if self.lost:
            return False
        now = self.clock()
        if now < self.next_renewal:
            return True
        try:
            renewed = self.store.renew_lease(self.fence, self.ttl_s)
        except Exception as exc:  # noqa: BLE001  # the database is unreachable: retry soon, give up at expiry
            log.warning("job %s: lease renewal failed: %s", self.fence.job_id, exc)
            if self.clock() >= self.valid_until:
                self.mark_lost(f"the lease could not be renewed before it expired ({exc})")
                return False
            self.next_renewal = now + min(RETRY_S, self.ttl_s / RENEWALS_PER_TTL)
            return True
        if not renewed:
            self.mark_lost("the job is no longer owned by this attempt (recovered or ended elsewhere)")
            return False
        self.valid_until = now + self.ttl_s
        self.next_renewal = now + self.ttl_s / RENEWALS_PER_TTL
        return True
