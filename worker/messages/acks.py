"""Acknowledge a task's broker message as soon as its job is claimed.

The task is declared with late acks, so its message stays unacknowledged (and is
redelivered after the broker's visibility timeout if the worker dies) until the job
is claimed in the database. From the claim on, the lease and the reaper recover the
job, so the message is acknowledged right away: a long job's message is then never
redelivered, whatever the visibility timeout (celery#5935). The task finds its own
message through the worker's table of active requests (``celery.worker.state``); in
an eager call there is none, and the late ack at the end stands.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def acknowledge(task_id: str | None) -> bool:
    """Acknowledge the message of the running task ``task_id``; ``False`` if it is not found."""
    if task_id is None:
        return False
    from celery.worker import state  # the worker's process-wide request table

    request = state.requests.get(task_id)
    if request is None:
        log.debug("task %s: no active request to acknowledge", task_id)
        return False
    request.acknowledge()
    return True
