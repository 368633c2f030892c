"""The lease keeper: renews on schedule, is lost when the job moved on, self-fences when it cannot renew."""

from __future__ import annotations

from typing import Any, cast

from halfcast.core.db.members import Members
from worker.gang.formation import MemberLease
from worker.lifecycle.lease import RENEWALS_PER_TTL, Lease
from worker.store import Fence, JobStore

FENCE = Fence("job", 1, "w")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeStore:
    """Answers renewals with the queued results (``True``, ``False`` or an exception)."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls = 0

    def renew_lease(self, fence: Fence, ttl_s: float) -> bool:
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return bool(answer)


def test_renews_only_when_due() -> None:
    clock, store = Clock(), FakeStore(True, True)
    lease = Lease(cast(JobStore, store), FENCE, ttl_s=10.0, clock=clock)  # a FakeStore
    assert lease.renew_if_due() and store.calls == 0
    clock.now += 10.0 / RENEWALS_PER_TTL
    assert lease.renew_if_due() and store.calls == 1
    assert lease.renew_if_due() and store.calls == 1
    clock.now += 10.0 / RENEWALS_PER_TTL
    assert lease.renew_if_due() and store.calls == 2 and not lease.lost


def test_a_renewal_that_matches_no_row_loses_the_lease() -> None:
    clock, store = Clock(), FakeStore(False)
    lease = Lease(cast(JobStore, store), FENCE, ttl_s=10.0, clock=clock)  # a FakeStore
    clock.now += 5.0
    assert lease.renew_if_due() is False and lease.lost
    assert lease.renew_if_due() is False and store.calls == 1  # never renewed again


def test_database_errors_are_retried_until_the_lease_would_have_expired() -> None:
    clock = Clock()
    store = FakeStore(*[ConnectionError("database down")] * 50)
    lease = Lease(cast(JobStore, store), FENCE, ttl_s=10.0, clock=clock)  # a FakeStore
    while clock.now < 109.0:
        clock.now += 0.5
        assert lease.renew_if_due() is True, clock.now  # still within the lease: keep running
    clock.now = 110.0
    assert lease.renew_if_due() is False and lease.lost
    assert "could not be renewed" in (lease.lost_reason or "")


def test_a_renewal_after_errors_restores_the_lease() -> None:
    clock = Clock()
    store = FakeStore(ConnectionError("blip"), True)
    lease = Lease(cast(JobStore, store), FENCE, ttl_s=10.0, clock=clock)  # a FakeStore
    clock.now += 2.0
    assert lease.renew_if_due()
    clock.now += 1.0
    assert lease.renew_if_due() and lease.valid_until == clock.now + 10.0


class FakeMembers:
    """Answers membership renewals with the queued results, as :class:`FakeStore` does."""

    def __init__(self, *answers: Any) -> None:
        self.store = FakeStore(*answers)

    def renew(self, member_id: int, ttl_s: float) -> bool:
        return self.store.renew_lease(FENCE, ttl_s)


def test_a_membership_lease_renews_and_is_lost_when_closed_elsewhere() -> None:
    clock, members = Clock(), FakeMembers(True, False)
    lease = MemberLease(cast(Members, members), 7, ttl_s=10.0, clock=clock)  # a FakeMembers
    clock.now += 2.0
    assert lease.renew_if_due() and lease.valid_until == clock.now + 10.0
    clock.now += 2.0
    assert lease.renew_if_due() is False and lease.lost_reason == "the membership was closed elsewhere"


def test_a_membership_lease_self_fences_when_it_cannot_be_renewed_before_it_expires() -> None:
    clock = Clock()
    members = cast(Members, FakeMembers(*[ConnectionError("down")] * 50))
    lease = MemberLease(members, 7, ttl_s=10.0, clock=clock)
    while clock.now < 109.0:
        clock.now += 0.5
        assert lease.renew_if_due() is True
    clock.now = 110.0
    assert lease.renew_if_due() is False
    assert lease.lost_reason == "the membership could not be renewed before it expired (down)"
