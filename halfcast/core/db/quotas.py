"""Per-owner quota limits (``owner_quotas``): the limits, their overrides, and audited changes.

Four limits bound what one owner may have at once (:data:`LIMITS`):

- ``max_active_jobs``: jobs not yet terminal (``queued``, ``starting``, ``running``, ``cancelling``);
- ``max_gpus``: the sum of ``spec.gpus`` over those jobs;
- ``max_queued_jobs``: jobs in ``queued``;
- ``max_storage_bytes``: the bytes of the owner's registered datasets and models.

The server's defaults come from settings (``HALFCAST_QUOTA_*``; unset means
unlimited). An owner's row overrides them limit by limit; a null column there means
"the default". Changes are operator commands (``halfcast quotas``) audited as
``quota.set`` / ``quota.clear``. Enforcement is :mod:`halfcast.core.db.quota_check`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from sqlalchemy import select
from sqlalchemy.orm import Session

from halfcast.core.db import audit
from halfcast.core.db.engine import begin_write
from halfcast.core.db.models import OwnerQuota, utcnow
from halfcast.core.db.tokens import validate_owner

#: The limit names, as in the 429 answer, the ``owner_quotas`` columns and the CLI options.
LIMITS = ("max_active_jobs", "max_gpus", "max_queued_jobs", "max_storage_bytes")


@dataclass(frozen=True)
class QuotaLimits:
    """Limits of one owner (``None``: unlimited), or a partial override (``None``: not overridden)."""

    max_active_jobs: int | None = None
    max_gpus: int | None = None
    max_queued_jobs: int | None = None
    #: Bytes of the owner's registered datasets and models (checked on upload: :mod:`halfcast.core.db.registry`).
    max_storage_bytes: int | None = None

    def is_unlimited(self) -> bool:
        """Whether no limit is set."""
        return all(getattr(self, name) is None for name in LIMITS)

    def over(self, defaults: QuotaLimits) -> QuotaLimits:
        """These limits where set, ``defaults`` elsewhere."""
        return replace(defaults, **{name: value for name, value in asdict(self).items() if value is not None})


#: No limit at all (the server default when no ``HALFCAST_QUOTA_*`` is set).
UNLIMITED = QuotaLimits()


def _row_limits(row: OwnerQuota | None) -> QuotaLimits:
    if row is None:
        return UNLIMITED
    return QuotaLimits(**{name: getattr(row, name) for name in LIMITS})


def get_override(session: Session, owner: str) -> QuotaLimits:
    """The override stored for ``owner`` (all ``None`` when it has none); does not end the transaction."""
    return _row_limits(session.get(OwnerQuota, owner, populate_existing=True))


def effective_limits(session: Session, owner: str, defaults: QuotaLimits) -> QuotaLimits:
    """``owner``'s limits: its override where set, else ``defaults``; does not end the transaction."""
    return get_override(session, owner).over(defaults)


def _validate(values: dict[str, int | None]) -> None:
    for name, value in values.items():
        if name not in LIMITS:
            raise ValueError(f"unknown quota limit {name!r}; limits are {', '.join(LIMITS)}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")


def set_quota(
    session: Session, owner: str, values: dict[str, int | None], *, actor: str, via: str = "cli"
) -> QuotaLimits:
    """Set the given limits of ``owner``'s override (``None``: back to the default; limits not named are kept).

    Audits ``quota.set`` (subject: the owner; details: the values set and the override
    after the change) and commits; returns the override. Raises ``ValueError`` for an
    invalid owner (:func:`halfcast.core.db.tokens.validate_owner`), an unknown limit name or a
    negative value.
    """
    owner = validate_owner(owner)
    _validate(values)
    begin_write(session)  # the read and the write are one write transaction (SQLite: no lock upgrade)
    row = session.get(OwnerQuota, owner, populate_existing=True)
    if row is None:
        row = OwnerQuota(owner=owner)
        session.add(row)
    for name, value in values.items():
        setattr(row, name, value)
    row.updated_at = utcnow()
    override = _row_limits(row)
    audit.add_event(session, actor, "quota.set", owner, {"set": dict(values), "override": asdict(override), "via": via})
    session.commit()
    return override


def clear_quota(session: Session, owner: str, *, actor: str, via: str = "cli") -> bool:
    """Delete ``owner``'s override (its limits become the defaults); audit ``quota.clear`` and commit.

    Returns whether there was one (nothing is audited when there was not).
    """
    begin_write(session)  # the read and the write are one write transaction (SQLite: no lock upgrade)
    row = session.get(OwnerQuota, owner.strip(), populate_existing=True)
    if row is None:
        session.commit()
        return False
    previous = asdict(_row_limits(row))
    session.delete(row)
    audit.add_event(session, actor, "quota.clear", row.owner, {"previous": previous, "via": via})
    session.commit()
    return True


def list_overrides(session: Session) -> list[tuple[str, QuotaLimits]]:
    """Every owner with an override, by owner, with the override (``None``: the default)."""
    rows = session.scalars(select(OwnerQuota).order_by(OwnerQuota.owner))
    return [(row.owner, _row_limits(row)) for row in rows]
