"""The typed failure reasons of a ``failed`` job and whether a failure with each is retried.

The reasons are :class:`halfcast.contracts.status.FailureReason`; docs/architecture.md and
docs/results.md list the same (a test checks it). Only a lost worker is retried (from the attempt's last
checkpoint, up to the spec's ``max_attempts``), and a worker's graceful shutdown
(``worker_shutdown``: the run was stopped and checkpointed on purpose), which does not
use up an attempt; a failure of the job itself (out of memory, diverging numerics, a bad
spec) would fail the same way again, so it is not retried blindly.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from halfcast.contracts.status import FailureReason

#: The reasons an attempt is retried with (up to ``max_attempts``); every other one is final.
RETRIED_REASONS: frozenset[FailureReason] = frozenset({FailureReason.WORKER_LOST, FailureReason.WORKER_SHUTDOWN})

#: reason -> retried (up to ``max_attempts``) when an attempt fails with it, for every :class:`FailureReason`.
RETRY_POLICY: Mapping[str, bool] = MappingProxyType({reason: reason in RETRIED_REASONS for reason in FailureReason})

#: Attempts ended with these reasons do not count against ``max_attempts``.
UNCOUNTED_REASONS: frozenset[str] = frozenset({FailureReason.WORKER_SHUTDOWN})

#: Every typed failure reason.
FAILURE_REASONS: frozenset[str] = frozenset(FailureReason)


def should_retry(reason: str | None, attempt: int, max_attempts: int) -> bool:
    """Whether attempt number ``attempt`` (1-based) that failed with ``reason`` gets another attempt.

    Unknown reasons are never retried.
    """
    return bool(reason is not None and RETRY_POLICY.get(reason, False) and attempt < max_attempts)
