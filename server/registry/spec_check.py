"""``POST /jobs``: the registered datasets and models a spec names, checked for the caller (422 at the field).

The spec is checked again with the registered dataset's ``format``, ``file_format`` and
``sha256`` filled in (:func:`halfcast.core.registry.refs.resolve_refs`), so the cross-field rules that
need the format (masking, column map, early stopping's metric) apply; the job stores the spec
as submitted. The check runs inside the submission's transaction, under the owner's lock
(:func:`halfcast.core.db.jobs.create_job`), so a dataset cannot be deleted between it and the INSERT.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sqlalchemy.orm import Session

from halfcast.contracts.spec import JobSpec
from halfcast.core.registry.refs import RefError, names_registered_inputs, resolve_refs
from server.access import owner_visible
from server.auth import Principal


def _body_errors(exc: ValidationError) -> RequestValidationError:
    errors = exc.errors(include_url=False, include_context=False)
    return RequestValidationError([{**error, "loc": ("body", *error["loc"])} for error in errors])


def registered_inputs_check(spec: JobSpec, principal: Principal) -> Callable[[Session], None] | None:
    """The check of the registered inputs ``spec`` names for ``principal`` (``None`` when it names none)."""
    raw = spec.model_dump(mode="json")
    if not names_registered_inputs(raw):
        return None

    def check(session: Session) -> None:
        try:
            JobSpec.model_validate(resolve_refs(session, raw, lambda owner: owner_visible(principal, owner)))
        except RefError as exc:
            raise RequestValidationError(
                [{"type": "value_error", "loc": ("body", *exc.loc), "msg": exc.message, "input": exc.value}]
            ) from None
        except ValidationError as exc:
            raise _body_errors(exc) from None

    return check
