"""Registered datasets and models as the API answers them (``/datasets``, ``/models``; docs/registry.md).

The registry routes answer these models (built from their rows by :mod:`server.registry.schemas`) and
:class:`halfcast.client.HalfcastClient` returns them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


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


class DatasetList(BaseModel):
    """A page of registered datasets, newest first; pass ``next_cursor`` back as ``cursor`` (null: last page)."""

    datasets: list[DatasetPublic]
    next_cursor: str | None


class ModelList(BaseModel):
    """A page of registered models, newest first; pass ``next_cursor`` back as ``cursor`` (null: last page)."""

    models: list[ModelPublic]
    next_cursor: str | None
