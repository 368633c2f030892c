"""The typed failure reasons of a ``failed`` job and whether a failure with each is retried.

One table for the whole project: docs/architecture.md and docs/results.md list the same
reasons (a test checks it). Only a lost worker is retried (from the attempt's last
checkpoint, up to the spec's ``max_attempts``), and a worker's graceful shutdown
(``worker_shutdown``: the run was stopped and checkpointed on purpose), which does not
use up an attempt; a failure of the job itself (out of memory, diverging numerics, a bad
spec) would fail the same way again, so it is not retried blindly.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

#: reason -> retried (up to ``max_attempts``) when an attempt fails with it.
RETRY_POLICY: Mapping[str, bool] = MappingProxyType(
    {
        "spec_invalid": False,
        "precision_unsupported": False,
        "gpu_unavailable": False,
        "data_unavailable": False,
        "model_unavailable": False,
        "checkpoint_unavailable": False,
        "launch_failed": False,
        "rank_failed": False,
        "oom": False,
        "collective_timeout": False,
        "nonfinite_loss": False,
        "loss_scale_collapsed": False,
        "nonfinite_gradients": False,
        "no_update_applied": False,
        "deadline_exceeded": False,
        "worker_lost": True,
        "worker_shutdown": True,
        "worker_error": False,
        "enqueue_failed": False,
    }
)

#: Attempts ended with these reasons do not count against ``max_attempts``.
UNCOUNTED_REASONS: frozenset[str] = frozenset({"worker_shutdown"})

#: Every typed failure reason.
FAILURE_REASONS: frozenset[str] = frozenset(RETRY_POLICY)


def should_retry(reason: str | None, attempt: int, max_attempts: int) -> bool:
    """Whether attempt number ``attempt`` (1-based) that failed with ``reason`` gets another attempt.

    Unknown reasons are never retried.
    """
    return bool(reason is not None and RETRY_POLICY.get(reason, False) and attempt < max_attempts)
