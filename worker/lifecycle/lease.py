"""The leases a worker holds, renewed by its supervising thread: an attempt's on its job, a node's on its gang membership.

:class:`RenewedLease` is the self-fencing renewal both share; :class:`Lease` is the job's
(:class:`worker.gang.formation.MemberLease` the membership's).

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


class RenewedLease:
    """A lease renewed by ``renew`` every ``ttl / RENEWALS_PER_TTL`` seconds (taken at ``clock()`` time of construction).

    ``renew`` pushes the expiry one ``ttl`` ahead and says whether it still held the lease; False loses it
    for good (``taken_over``). Renewals that raise are retried until the lease, as far as this process
    knows, has expired: then it is lost too (self-fencing). ``holder`` names it in the log ("job <id>:
    attempt 2", "membership 7"), ``noun`` in the reason ("lease", "membership").
    """

    def __init__(
        self,
        renew: Callable[[], bool],
        ttl_s: float,
        *,
        holder: str,
        noun: str,
        taken_over: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._renew = renew
        self.ttl_s = ttl_s
        self.clock = clock
        self.holder, self.noun, self.taken_over = holder, noun, taken_over
        now = clock()
        self.valid_until = now + ttl_s
        self.next_renewal = now + ttl_s / RENEWALS_PER_TTL
        self.lost_reason: str | None = None

    @property
    def lost(self) -> bool:
        """Whether the holder no longer owns what the lease covers (it must stop and write nothing)."""
        return self.lost_reason is not None

    def mark_lost(self, reason: str) -> None:
        """Record that the lease is no longer held (e.g. a fenced write matched no row)."""
        if self.lost_reason is None:
            log.warning("%s lost its lease: %s", self.holder, reason)
            self.lost_reason = reason

    def renew_if_due(self) -> bool:
        """Renew the lease when a renewal is due; return whether the lease is still held."""
        if self.lost:
            return False
        now = self.clock()
        if now < self.next_renewal:
            return True
        try:
            renewed = self._renew()
        except Exception as exc:  # noqa: BLE001  # the database is unreachable: retry soon, give up at expiry
            log.warning("%s: %s renewal failed: %s", self.holder, self.noun, exc)
            if self.clock() >= self.valid_until:
                self.mark_lost(f"the {self.noun} could not be renewed before it expired ({exc})")
                return False
            self.next_renewal = now + min(RETRY_S, self.ttl_s / RENEWALS_PER_TTL)
            return True
        if not renewed:
            self.mark_lost(self.taken_over)
            return False
        self.valid_until = now + self.ttl_s
        self.next_renewal = now + self.ttl_s / RENEWALS_PER_TTL
        return True


class Lease(RenewedLease):
    """The lease of one claimed attempt on its job (``lease_expires_at``), fenced by attempt and owner."""

    def __init__(
        self, store: JobStore, fence: Fence, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.fence = fence
        super().__init__(
            lambda: store.renew_lease(fence, ttl_s),
            ttl_s,
            holder=f"job {fence.job_id}: attempt {fence.attempt}",
            noun="lease",
            taken_over="the job is no longer owned by this attempt (recovered or ended elsewhere)",
            clock=clock,
        )
