"""The registry routes' resources built from their rows (the models themselves are :mod:`halfcast.contracts.registry`)."""

from __future__ import annotations

from halfcast.common.timeutil import as_utc
from halfcast.contracts.registry import DatasetList, DatasetPublic, ModelList, ModelPublic
from halfcast.core.db.models import RegisteredDataset, RegisteredModel

__all__ = ["DatasetList", "DatasetPublic", "ModelList", "ModelPublic", "dataset_public", "model_public"]


def dataset_public(row: RegisteredDataset) -> DatasetPublic:
    """The resource of a ``datasets`` row."""
    return DatasetPublic(
        id=row.id,
        name=row.name,
        owner=row.owner,
        format=row.format,
        file_format=row.file_format,
        rows=row.rows,
        bytes=row.bytes,
        sha256=row.sha256,
        created_at=as_utc(row.created_at),
    )


def model_public(row: RegisteredModel) -> ModelPublic:
    """The resource of a ``models`` row."""
    return ModelPublic(
        id=row.id,
        name=row.name,
        owner=row.owner,
        model_type=row.model_type,
        files=row.files,
        bytes=row.bytes,
        sha256=row.sha256,
        source_job_id=row.source_job_id,
        created_at=as_utc(row.created_at),
    )
