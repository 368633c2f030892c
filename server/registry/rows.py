"""What the dataset and model routes share about stored rows: a page of them, and deleting one."""

from __future__ import annotations

from sqlalchemy.orm import Session

from halfcast.core.db import registry as repo
from halfcast.core.db.models import RegisteredDataset, RegisteredModel
from halfcast.core.db.paging import InvalidCursor
from halfcast.core.registry.layout import RegistryLayout
from halfcast.core.settings import Settings
from server.access import visible_registered_or_404
from server.auth import Principal
from server.http.errors import ApiError
from server.registry.request_checks import invalid


def visible_page(
    session: Session, table: type[repo.Row], principal: Principal, limit: int, cursor: str | None
) -> repo.RegisteredPage:
    """The rows of ``table`` ``principal`` sees (an admin: everyone's), newest first; a bad ``cursor`` is a 422."""
    owner = None if principal.admin else principal.owner
    try:
        return repo.list_rows(session, table, owner=owner, limit=limit, cursor=cursor)
    except InvalidCursor as exc:
        raise invalid(("query", "cursor"), str(exc), cursor) from None


def delete_visible(
    session: Session, kind: repo.RegisteredKind, item_id: str, settings: Settings, principal: Principal
) -> None:
    """Delete the dataset or model ``item_id`` ``principal`` sees: 404 if it does not, 409 while a live job names it."""
    row: RegisteredDataset | RegisteredModel | None = repo.get_registered(session, kind, item_id)
    visible_registered_or_404(row, kind.value, item_id, principal)
    session.commit()
    try:
        deleted = repo.delete_registered(session, kind, item_id, principal.owner, RegistryLayout(settings.registry_dir))
    except repo.RegisteredInUse as exc:
        raise ApiError(409, str(exc)) from None
    if not deleted:
        raise ApiError(404, f"{kind.value} {item_id} not found")
