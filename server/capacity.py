"""Submission check: a GPU job must fit on some registered worker (else 422 at ``body.gpus``), and its model and
data paths must be ones some registered worker's roots can hold (:mod:`server.input_roots`); chat rows need a
tokenizer with a chat template (:mod:`server.chat_template_check`).

"Registered" means a worker that heartbeat within ``HALFCAST_WORKER_FORGET_S``
(live now or lately, so a worker restarting does not turn jobs away). With no
registered worker at all (the API started first, or every worker is being
replaced) nothing is rejected: the job waits in the queue like any other. CPU
jobs (``gpus`` 0) are never rejected here.
"""

from __future__ import annotations

from fastapi.exceptions import RequestValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from halfcast.contracts.spec import JobSpec
from halfcast.core.db.models import Job, utcnow
from halfcast.core.db.workers import largest_gpu_count
from halfcast.core.settings import Settings
from server.chat_template_check import chat_template_errors
from server.input_roots import input_root_errors, reported_roots, rooted_paths


def check_gpu_capacity(
    session: Session, spec: JobSpec, settings: Settings, idempotency_key: str | None, owner: str
) -> None:
    """Raise ``RequestValidationError`` (422) when no registered worker has ``spec.gpus`` GPUs (at ``["body",
    "gpus"]``) or can read a model or data path of ``spec`` (at that path's field, :mod:`server.input_roots`).

    A repeated request whose ``Idempotency-Key`` already names a job of ``owner`` is not checked
    (it answers with that job). The read transaction is ended before returning, so
    the INSERT that follows starts a transaction of its own.
    """
    if spec.gpus <= 0 and not rooted_paths(spec):
        return
    try:
        if idempotency_key is not None and _key_used(session, idempotency_key, owner):
            return
        largest = largest_gpu_count(session, utcnow(), settings.worker_forget_s) if spec.gpus > 0 else None
        roots = reported_roots(session, settings) if rooted_paths(spec) else None
    finally:
        session.commit()
    errors = input_root_errors(spec, roots) + chat_template_errors(spec, (roots or {}).get("model", []))
    if largest is not None and spec.gpus > largest:
        errors.insert(
            0,
            {
                "type": "value_error",
                "loc": ("body", "gpus"),
                "msg": f"no worker has {spec.gpus} GPUs (largest: {largest})",
                "input": spec.gpus,
            },
        )
    if errors:
        raise RequestValidationError(errors)


def _key_used(session: Session, key: str, owner: str) -> bool:
    return session.scalar(select(Job.id).where(Job.owner == owner, Job.idempotency_key == key)) is not None
