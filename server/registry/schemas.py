"""Resources of the registry routes: a registered dataset, a registered model, and their lists."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from common.timeutil import as_utc
from server.db.models import RegisteredDataset, RegisteredModel


class DatasetPublic(BaseModel):
    """A registered dataset (``POST /datasets``): a file of rows checked against ``format``."""

    id: str
    name: str
    owner: str
    format: Literal["text", "instruction", "chat", "classification"] = Field(description="The rows' jsonl format")
    file_format: Literal["jsonl", "csv"]
    rows: int = Field(description="Rows (records) in the file")
    bytes: int = Field(description="Size of the file")
    sha256: str = Field(description="SHA-256 of the file (hex); the trainer checks it before reading a row")
    created_at: datetime

    @classmethod
    def from_row(cls, row: RegisteredDataset) -> DatasetPublic:
        return cls(id=row.id, name=row.name, owner=row.owner, format=row.format, file_format=row.file_format,  # type: ignore[arg-type]
                   rows=row.rows, bytes=row.bytes, sha256=row.sha256, created_at=as_utc(row.created_at))  # fmt: skip


class ModelPublic(BaseModel):
    """A registered Hugging Face model: uploaded (``POST /models``) or a job's exported model."""

    id: str
    name: str
    owner: str
    model_type: str = Field(description="model_type of its config.json")
    files: int
    bytes: int = Field(description="Total size of its files")
    sha256: str = Field(description="SHA-256 over its sorted file names and each file's SHA-256 (hex)")
    source_job_id: str | None = Field(description="The job whose export/model it was registered from; null: uploaded")
    created_at: datetime

    @classmethod
    def from_row(cls, row: RegisteredModel) -> ModelPublic:
        return cls(id=row.id, name=row.name, owner=row.owner, model_type=row.model_type, files=row.files,
                   bytes=row.bytes, sha256=row.sha256, source_job_id=row.source_job_id,
                   created_at=as_utc(row.created_at))  # fmt: skip


class DatasetList(BaseModel):
    """A page of registered datasets, newest first; pass ``next_cursor`` back as ``cursor`` (null: last page)."""

    datasets: list[DatasetPublic]
    next_cursor: str | None


class ModelList(BaseModel):
    """A page of registered models, newest first; pass ``next_cursor`` back as ``cursor`` (null: last page)."""

    models: list[ModelPublic]
    next_cursor: str | None
