"""Rows of registered datasets and models (``datasets``, ``models``): stored with their files, read, listed, deleted.

Creating and deleting move files in the registry directory inside the row's transaction, under
locks, so that a committed row always has its file and a refused or failed request stores none:

- the transaction begins with the owner's lock (:func:`halfcast.core.db.quota_check.begin_owner_transaction`:
  the same one job submissions take, so a job naming a dataset and the dataset's deletion are
  serialised), then takes the lock of the file (PostgreSQL: an advisory lock on the dataset's
  SHA-256, as two owners may share a file; SQLite's ``BEGIN IMMEDIATE`` already serialises writers);
- an upload checks the storage quota, renames its staged file or directory into place and inserts
  the row and its audit event, then commits (a dataset file that already exists is replaced by the
  same bytes);
- a deletion refuses while a job that is not terminal names the row (:class:`RegisteredInUse`),
  deletes the row and its audit event, renames the file (a dataset's only when no other row shares
  it) into the trash, commits, then removes the trash; a failed commit renames it back.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from halfcast.core.db import audit
from halfcast.core.db.models import ACTIVE_STATUSES, Job, RegisteredDataset, RegisteredModel
from halfcast.core.db.paging import InvalidCursor, newest_first
from halfcast.core.db.quota_check import begin_owner_transaction, enforce_storage
from halfcast.core.db.quotas import QuotaLimits
from halfcast.core.registry.layout import RegistryLayout, remove_path

Row = TypeVar("Row", RegisteredDataset, RegisteredModel)


@dataclass(frozen=True)
class UploadKey:
    """An upload's ``Idempotency-Key`` and the hash of what it sent (parameters and the body's SHA-256)."""

    key: str
    request_hash: str


class UploadKeyMismatch(ValueError):
    """The ``Idempotency-Key`` was used before for an upload that sent something else."""

    def __init__(self, kind: str, item_id: str) -> None:
        super().__init__(f"Idempotency-Key already used for {kind} {item_id}, created from a different upload")
        self.item_id = item_id


def upload_by_key(session: Session, table: type[Row], owner: str, key: str) -> Row | None:
    """The dataset or model ``owner`` uploaded with Idempotency-Key ``key``, if any."""
    return session.scalars(select(table).where(table.owner == owner, table.idempotency_key == key)).one_or_none()


def replayed(row: Row, upload: UploadKey, kind: str) -> Row:
    """``row`` when ``upload`` sent what created it; :class:`UploadKeyMismatch` otherwise."""
    if row.request_hash != upload.request_hash:
        raise UploadKeyMismatch(kind, row.id)
    return row


def _earlier_upload(session: Session, row: Row, upload: UploadKey | None, kind: str) -> Row | None:
    """Inside the owner's transaction: the row an earlier upload with the same key created (then nothing is stored)."""
    if upload is None:
        return None
    earlier = upload_by_key(session, type(row), row.owner, upload.key)
    if earlier is None:
        row.idempotency_key, row.request_hash = upload.key, upload.request_hash
        return None
    return replayed(earlier, upload, kind)


class RegisteredKind(StrEnum):
    """What a registry row is: a dataset or a model (the word of its audit events and messages)."""

    DATASET = "dataset"
    MODEL = "model"


#: Jobs named in a :class:`RegisteredInUse` at most.
IN_USE_SHOWN = 5

__all__ = [
    "InvalidCursor",
    "RegisteredInUse",
    "RegisteredKind",
    "RegisteredPage",
    "create_dataset",
    "create_model",
    "delete_registered",
    "get_dataset",
    "get_model",
    "get_registered",
    "list_rows",
]


class RegisteredInUse(RuntimeError):
    """Jobs that are not terminal name the dataset or model (``job_ids``: the oldest few)."""

    def __init__(self, kind: str, item_id: str, job_ids: Sequence[str]) -> None:
        super().__init__(f"{kind} {item_id} is used by jobs that have not ended: {', '.join(job_ids)}")
        self.job_ids = list(job_ids)


@dataclass(frozen=True)
class RegisteredPage:
    """One page of rows, newest first; ``next_cursor`` is ``None`` on the last page."""

    rows: Sequence[Any]
    next_cursor: str | None


def _lock_file(session: Session, key: str) -> None:
    """PostgreSQL: the transaction-scoped advisory lock of registry file ``key`` (SQLite: the write lock is held)."""
    if session.get_bind().dialect.name == "postgresql":
        digest = hashlib.sha256(f"halfcast.registry:{key}".encode()).digest()
        session.execute(select(func.pg_advisory_xact_lock(int.from_bytes(digest[:8], "big", signed=True))))


def _details(row: RegisteredDataset | RegisteredModel, **extra: object) -> dict[str, object]:
    return {"owner": row.owner, "name": row.name, "bytes": row.bytes, "sha256": row.sha256, **extra}


def get_dataset(session: Session, dataset_id: str) -> RegisteredDataset | None:
    return session.get(RegisteredDataset, dataset_id, populate_existing=True)


def get_model(session: Session, model_id: str) -> RegisteredModel | None:
    return session.get(RegisteredModel, model_id, populate_existing=True)


def list_rows(
    session: Session, table: type[Row], *, owner: str | None, limit: int, cursor: str | None
) -> RegisteredPage:
    """Rows of ``table`` newest first (ties by id), of ``owner`` (``None``: everyone's), after ``cursor``.

    Raises :class:`InvalidCursor` for a cursor this server did not produce.
    """
    query = select(table)
    if owner is not None:
        query = query.where(table.owner == owner)
    rows, next_cursor = newest_first(session, query, table, limit=limit, cursor=cursor)
    return RegisteredPage(rows, next_cursor)


def _jobs_using(session: Session, column: Any, item_id: str) -> list[str]:
    query = (
        select(Job.id)
        .where(Job.status.in_(sorted(ACTIVE_STATUSES)), column.as_string() == item_id)
        .order_by(Job.created_at)
        .limit(IN_USE_SHOWN)
    )
    return list(session.scalars(query))


def _commit_or_restore(session: Session, moved: list[tuple[Path, Path]]) -> None:
    """Commit; if that fails, move each ``(from, to)`` back and re-raise."""
    try:
        session.commit()
    except BaseException:
        session.rollback()
        for source, target in reversed(moved):
            os.replace(target, source)
        raise


# ----------------------------------------------------------------------------- datasets


def create_dataset(
    session: Session,
    row: RegisteredDataset,
    staged: Path,
    layout: RegistryLayout,
    quota_defaults: QuotaLimits,
    upload: UploadKey | None = None,
) -> tuple[RegisteredDataset, bool]:
    """Store ``row`` with its staged file (renamed to its content address), audited as ``dataset.create``;
    ``(row, True)``. With ``upload``, a dataset the owner already uploaded with that key comes back as
    ``(that row, False)`` and nothing is stored.

    Raises :class:`halfcast.core.db.quota_check.QuotaExceeded` (nothing stored) when the owner's
    registered bytes would exceed ``max_storage_bytes``, :class:`UploadKeyMismatch` when the
    key's dataset came from a different upload.
    """
    begin_owner_transaction(session, row.owner)
    placed = False
    try:
        if (earlier := _earlier_upload(session, row, upload, "dataset")) is not None:
            session.rollback()
            return earlier, False
        _lock_file(session, f"dataset:{row.sha256}")
        enforce_storage(session, row.owner, row.bytes, quota_defaults)
        os.replace(staged, layout.dataset_file(row.sha256, row.file_format))  # same bytes if it was there
        placed = True
        session.add(row)
        audit.add_event(session, row.owner, "dataset.create", row.id, _details(row, format=row.format, rows=row.rows))
        session.commit()
    except BaseException:
        session.rollback()
        if placed:
            _drop_unreferenced_file(session, layout, row)
        raise
    return row, True


def _drop_unreferenced_file(session: Session, layout: RegistryLayout, row: RegisteredDataset) -> None:
    """After a failed insert: remove the dataset's file unless a committed row shares it."""
    try:
        begin_owner_transaction(session, row.owner)
        _lock_file(session, f"dataset:{row.sha256}")
        if not _sharing(session, row):
            layout.dataset_file(row.sha256, row.file_format).unlink(missing_ok=True)
        session.commit()
    except Exception:  # noqa: BLE001  # best effort: an unreferenced file is only wasted space
        session.rollback()


def _sharing(session: Session, row: RegisteredDataset) -> int:
    """Other rows with the same file."""
    query = (
        select(func.count())
        .select_from(RegisteredDataset)
        .where(
            RegisteredDataset.sha256 == row.sha256,
            RegisteredDataset.file_format == row.file_format,
            RegisteredDataset.id != row.id,
        )
    )
    return int(session.scalar(query) or 0)


def _lock_dataset_file(session: Session, row: RegisteredDataset) -> None:
    _lock_file(session, f"dataset:{row.sha256}")


def _trash_dataset_file(session: Session, row: RegisteredDataset, layout: RegistryLayout) -> list[tuple[Path, Path]]:
    """Trash the dataset's file unless another row shares it (under the file's lock)."""
    return _trash_if(not _sharing(session, row), layout.dataset_file(row.sha256, row.file_format), layout)


def _trash_if(condition: bool, path: Path, layout: RegistryLayout) -> list[tuple[Path, Path]]:
    """Rename ``path`` into the trash when ``condition`` holds and it exists; the ``(from, to)`` moves made."""
    if not condition or not os.path.lexists(path):
        return []
    trash = layout.trash_path()
    os.replace(path, trash)
    return [(path, trash)]


# ----------------------------------------------------------------------------- models


def create_model(
    session: Session,
    row: RegisteredModel,
    staged: Path,
    layout: RegistryLayout,
    quota_defaults: QuotaLimits,
    *,
    actor: str,
    via: str,
    upload: UploadKey | None = None,
) -> tuple[RegisteredModel, bool]:
    """Store ``row`` with its staged directory (renamed to ``models/<id>``), audited as ``model.create`` by
    ``actor``; ``(row, True)``. With ``upload``, a model the owner already uploaded with that key comes
    back as ``(that row, False)`` and nothing is stored.

    ``via``: ``upload`` or ``export``. Raises :class:`halfcast.core.db.quota_check.QuotaExceeded`
    (nothing stored) when the owner's registered bytes would exceed ``max_storage_bytes``,
    :class:`UploadKeyMismatch` when the key's model came from a different upload.
    """
    target = layout.model_dir(row.id)
    begin_owner_transaction(session, row.owner)
    placed = False
    try:
        if (earlier := _earlier_upload(session, row, upload, "model")) is not None:
            session.rollback()
            return earlier, False
        enforce_storage(session, row.owner, row.bytes, quota_defaults)
        os.replace(staged, target)
        placed = True
        session.add(row)
        details = _details(row, model_type=row.model_type, via=via, job_id=row.source_job_id)
        audit.add_event(session, actor, "model.create", row.id, details)
        session.commit()
    except BaseException:
        session.rollback()
        if placed:
            remove_path(target)
        raise
    return row, True


def _trash_model_dir(session: Session, row: RegisteredModel, layout: RegistryLayout) -> list[tuple[Path, Path]]:
    return _trash_if(True, layout.model_dir(row.id), layout)


def _no_file_lock(session: Session, row: RegisteredModel) -> None:
    """A model's directory is its own (``models/<id>``): nobody else's row shares it."""


# ----------------------------------------------------------------------------- deleting either


@dataclass(frozen=True)
class _Registered:
    """What deleting one kind of registered row needs: its table, the spec field naming it, its files' lock and trash."""

    kind: str
    table: type[RegisteredDataset] | type[RegisteredModel]
    spec_ref: Any
    lock: Callable[[Session, Any], None]
    trash: Callable[[Session, Any, RegistryLayout], list[tuple[Path, Path]]]


_KINDS = {
    RegisteredKind.DATASET: _Registered(
        "dataset",
        RegisteredDataset,
        Job.spec["dataset"]["config"]["dataset_id"],
        _lock_dataset_file,
        _trash_dataset_file,
    ),
    RegisteredKind.MODEL: _Registered(
        "model", RegisteredModel, Job.spec["model"]["config"]["model_id"], _no_file_lock, _trash_model_dir
    ),
}


def get_registered(session: Session, kind: RegisteredKind, item_id: str) -> RegisteredDataset | RegisteredModel | None:
    """The dataset or model ``item_id``, freshly read; ``None`` if there is none."""
    row = session.get(_KINDS[kind].table, item_id, populate_existing=True)
    # session.get types a union of tables' rows as their base; this narrows it back (the row is one of them)
    return row if isinstance(row, RegisteredDataset | RegisteredModel) else None


def delete_registered(session: Session, kind: RegisteredKind, item_id: str, actor: str, layout: RegistryLayout) -> bool:
    """Delete dataset or model ``item_id`` and its files, audited as ``<kind>.delete`` by ``actor``.

    A dataset's file goes only when no other row shares it (under the file's lock); a model's
    directory always. Returns ``False`` when there is no such row. Raises :class:`RegisteredInUse`
    while a job that is not terminal names it. End any transaction of ``session`` first.
    """
    return _delete(session, _KINDS[kind], item_id, actor, layout)


def _delete(session: Session, kind: _Registered, item_id: str, actor: str, layout: RegistryLayout) -> bool:
    """Delete row ``item_id`` of ``kind`` under its owner's lock, then its files (trashed, removed after the commit)."""
    owner = session.scalar(select(kind.table.owner).where(kind.table.id == item_id))
    session.commit()
    if owner is None:
        return False
    begin_owner_transaction(session, owner)
    try:
        row = session.get(kind.table, item_id, populate_existing=True)
        if row is None:
            session.commit()
            return False
        using = _jobs_using(session, kind.spec_ref, item_id)
        if using:
            raise RegisteredInUse(kind.kind, item_id, using)
        moved = _delete_row(session, kind, row, actor, layout)
    except BaseException:
        session.rollback()
        raise
    _commit_or_restore(session, moved)
    for _, trash in moved:
        remove_path(trash)
    return True


def _delete_row(
    session: Session, kind: _Registered, row: Any, actor: str, layout: RegistryLayout
) -> list[tuple[Path, Path]]:
    """Delete ``row`` with its audit event in the open transaction and trash its files; the moves made."""
    kind.lock(session, row)  # before the row goes: an upload of the same bytes waits
    session.delete(row)
    audit.add_event(session, actor, f"{kind.kind}.delete", row.id, _details(row))
    return kind.trash(session, row, layout)
