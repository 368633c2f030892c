"""A job's checkpoints and exports as the API lists them (``GET /jobs/{id}/checkpoints``, ``GET /jobs/{id}/exports``).

The routes (:mod:`server.routes.checkpoints`, :mod:`server.routes.exports`) answer these models and
:class:`halfcast.client.HalfcastClient` returns them; docs/api.md describes them.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from halfcast.contracts.records import ExportCheck
from halfcast.contracts.rundir import ExportKind


class CheckpointPublic(BaseModel):
    """One checkpoint file of a job."""

    attempt: int = Field(description="The attempt (1-based) that wrote it")
    name: str = Field(description="`final.pt` (written at `max_steps`) or `step-<N>.pt`")
    step: int = Field(description="Attempted optimizer steps it holds")
    final: bool = Field(description="Written when the job reached `max_steps`")
    size_bytes: int
    modified_at: datetime
    url: str = Field(description="Path of its download, relative to the API's base URL")


class CheckpointList(BaseModel):
    """Every checkpoint of a job: by attempt, then step; the last one is what `resume_from: <job id>` resumes from."""

    job_id: str
    checkpoints: list[CheckpointPublic]


class ExportFilePublic(BaseModel):
    """One file of an export."""

    name: str = Field(description="Path relative to the export's directory (`/`-separated)")
    size_bytes: int


class ExportPublic(BaseModel):
    """One export of a job."""

    kind: ExportKind = Field(description="`adapter` (a PEFT adapter) or `model` (a merged Hugging Face model)")
    attempt: int = Field(description="The attempt (1-based) that wrote it")
    files: list[ExportFilePublic] = Field(description="Its files, by name")
    size_bytes: int = Field(description="Bytes of its files together")
    modified_at: datetime
    url: str = Field(description="Path of its download (a tar), relative to the API's base URL")
    check: ExportCheck | None = Field(
        default=None,
        description="The merged `model` export checked against the trained model on held-out rows before it was "
        "published: the largest absolute logit difference and its tolerance (null for an adapter, or an older job)",
    )


class ExportList(BaseModel):
    """Each kind of export the job has, from the newest attempt that has it."""

    job_id: str
    exports: list[ExportPublic]
