"""The reaper: every worker looks for jobs whose lease expired and recovers them.

A job in ``starting``/``running``/``cancelling`` whose lease ran out has no live owner
(its worker was killed, hung, or lost its host, kuberay#1489, dstack#1053); the
reaper hands it to :class:`worker.lifecycle.recovery.Recovery`: requeued to resume from its
last checkpoint, ``cancelled`` if it was being cancelled, or ``failed`` with
``worker_lost`` once ``max_attempts`` are used. It trusts only live leases, never a
worker's word. It runs in every worker, once at start and then every
``HALFCAST_REAPER_INTERVAL_S``; each recovery is a compare-and-set, so reapers
running at once recover each job once. Each pass also asks the optional
:class:`worker.messages.broker_watch.BrokerWatch` whether the broker lost the messages of
queued jobs, and re-sends them if it did, and runs the optional ``recover_holds``:
sending again the messages that workers which are not live hold (:mod:`worker.messages.holds`), and the
optional ``audit_messages``: sending again the messages of queued jobs that no broker queue
holds (:mod:`worker.messages.message_audit`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from worker.lifecycle.recovery import Recovery, Resolution
from worker.messages.broker_watch import BrokerWatch

log = logging.getLogger(__name__)


class Reaper:
    """Recovers expired leases with ``recovery`` (and lost broker messages with ``broker_watch``).

    Runs every ``interval_s`` seconds until ``stop`` is set.
    """

    def __init__(
        self,
        recovery: Recovery,
        interval_s: float,
        stop: threading.Event,
        broker_watch: BrokerWatch | None = None,
        recover_holds: Callable[[], list[str]] | None = None,
        audit_messages: Callable[[], list[str]] | None = None,
    ) -> None:
        self.recovery = recovery
        self.interval_s = interval_s
        self.stop = stop
        self.broker_watch = broker_watch
        self.recover_holds = recover_holds
        self.audit_messages = audit_messages
        self.thread: threading.Thread | None = None

    def reap_once(self) -> dict[str, Resolution]:
        """One pass: recover every job whose lease has expired; return what became of each."""
        done: dict[str, Resolution] = {}
        for lease in self.recovery.expired_leases():
            try:
                resolution = self.recovery.recover_expired(lease)
            except Exception:
                log.exception("reaper: could not recover job %s", lease.job_id)
                continue
            if resolution is not None:
                log.warning(
                    "reaper: job %s (attempt %d of %s) %s", lease.job_id, lease.attempt, lease.owner, resolution
                )
                done[lease.job_id] = resolution
        return done

    def watch_broker(self) -> list[str] | None:
        """Re-send the queued jobs' messages if the broker lost its data (see :class:`BrokerWatch`)."""
        return None if self.broker_watch is None else self.broker_watch.check()

    def resend_held(self) -> list[str] | None:
        """Send again the messages of queued jobs that dead workers hold (see :mod:`worker.messages.holds`)."""
        return None if self.recover_holds is None else self.recover_holds()

    def resend_lost(self) -> list[str] | None:
        """Send again the messages no broker queue holds (see :mod:`worker.messages.message_audit`)."""
        return None if self.audit_messages is None else self.audit_messages()

    def run(self) -> None:
        """Reap now, then every ``interval_s`` seconds, until ``stop`` is set; errors are logged, never fatal."""
        while not self.stop.is_set():
            for duty in (self.reap_once, self.watch_broker, self.resend_held, self.resend_lost):
                try:
                    duty()
                except Exception:
                    log.exception("reaper: %s failed", duty.__name__)
            self.stop.wait(self.interval_s)

    def start(self) -> threading.Thread:
        """Run :meth:`run` in a daemon thread (once; later calls return the same thread)."""
        if self.thread is None:
            self.thread = threading.Thread(target=self.run, name="halfcast-reaper", daemon=True)
            self.thread.start()
        return self.thread
