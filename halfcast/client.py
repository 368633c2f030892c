"""A small typed Python client of the Halfcast HTTP API (used by the ``halfcast`` CLI).

>>> from halfcast.client import HalfcastClient
>>> with HalfcastClient("http://127.0.0.1:8000") as halfcast:     # doctest: +SKIP
...     job = halfcast.submit({"model": {"name": "mlp"}, "dataset": {"name": "digits"}})
...     for event in halfcast.events(job.id):
...         print(event.event, event.data)

Datasets and models are uploaded with :meth:`HalfcastClient.upload_dataset` and
:meth:`HalfcastClient.upload_model` (streamed, with a ``progress`` callback), listed, read and
deleted; :meth:`HalfcastClient.register_export` registers a job's exported model.
Every call answers the API's own models, the ones its routes answer (:mod:`contracts`): a job is a
:class:`~halfcast.contracts.resources.JobPublic`, a step record a :class:`~halfcast.contracts.stored.StoredStep`, an
evaluation a :class:`~halfcast.contracts.stored.StoredEval`, a log tail :class:`~halfcast.contracts.resources.LogLines`,
a checkpoint or an export :mod:`halfcast.contracts.artifacts`, a registered dataset or model
:mod:`halfcast.contracts.registry`, the audit log and ``whoami`` :mod:`halfcast.contracts.access`, and each event of a
stream an :class:`Event` whose ``data`` is the model of its name (:mod:`halfcast.contracts.events`). An
answer that does not validate as its model is a :class:`HalfcastError`.

Errors are typed: :class:`ServerUnavailable` (no connection, a timeout, or a 503),
:class:`ValidationFailed` (422, with every field error), :class:`NotFound` (404),
:class:`Conflict` (409), :class:`Unauthorized` (401: no, an unknown or a revoked
token), :class:`Forbidden` (403: needs an admin token), :class:`QuotaExceeded` (429: the
job would take its owner over a quota limit), and :class:`HalfcastError` for anything else.
Pass the API token as ``token`` (sent as ``Authorization: Bearer``).
"""

from __future__ import annotations

import builtins
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx

from halfcast.common.strict_json import json_value_problems
from halfcast.contracts.access import AuditList, SessionPublic
from halfcast.contracts.artifacts import CheckpointList, CheckpointPublic, ExportList, ExportPublic
from halfcast.contracts.events import JOB_EVENTS, LOG_EVENTS
from halfcast.contracts.records import StepRecord
from halfcast.contracts.registry import DatasetList, DatasetPublic, ModelList, ModelPublic
from halfcast.contracts.resources import EvalList, JobList, JobPublic, LogLines, MetricsPage
from halfcast.contracts.spec import JobSpec
from halfcast.contracts.stored import StoredEval
from halfcast.errors import (
    Conflict,
    FieldError,
    Forbidden,
    HalfcastError,
    NotFound,
    QuotaExceeded,
    ServerUnavailable,
    Unauthorized,
    ValidationFailed,
    parse_model,
    raise_for_status,
)
from halfcast.files.download import IncompleteDownload, save_response
from halfcast.files.export_extract import (
    UnsafeArchive,
    check_destination,
    extract_export,
    place_tree,
)
from halfcast.files.export_files import ExportKind, read_export
from halfcast.files.export_tar import archive_size, stream_archive
from halfcast.sse import Event, JobEvent, LogEvent, parse_sse, typed_events

#: The errors and events this module's calls raise and yield, importable from here as before.
__all__ = [
    "Conflict",
    "Event",
    "FieldError",
    "Forbidden",
    "HalfcastClient",
    "HalfcastError",
    "JobEvent",
    "LogEvent",
    "NotFound",
    "QuotaExceeded",
    "SavedCheckpoint",
    "ServerUnavailable",
    "Unauthorized",
    "ValidationFailed",
    "parse_sse",
]

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:8000"
#: Job resources :meth:`HalfcastClient.get` keeps with their ETag, to ask again with ``If-None-Match``.
KEPT_JOBS = 256

#: ``progress(sent, total)``: bytes of an upload sent so far, of ``total``.
Progress = Callable[[int, int], None]
#: Bytes read from a file per chunk of an upload.
UPLOAD_CHUNK = 1 << 20
#: Seconds an upload waits for each chunk to go and for the answer (the API checks the whole file first).
UPLOAD_TIMEOUT_S = 600.0
#: A dataset file's extension -> file format, and each file format's media type.
DATASET_EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
DATASET_MEDIA_TYPES = {"jsonl": "application/jsonl", "csv": "text/csv"}
#: A page of jobs as :meth:`HalfcastClient.list` returns it.
Jobs = list[JobPublic]
#: A page of registered datasets or models.
RegistryPage = TypeVar("RegistryPage", DatasetList, ModelList)


@dataclass(frozen=True)
class SavedCheckpoint:
    """A downloaded checkpoint: what :meth:`HalfcastClient.checkpoints` says of it, and the ``path`` it was saved at."""

    checkpoint: CheckpointPublic
    path: Path


def _file_chunks(path: Path, size: int, progress: Progress | None) -> Iterator[bytes]:
    """The bytes of the file at ``path`` in chunks of :data:`UPLOAD_CHUNK`, ``progress`` told as they go."""

    def read() -> Iterator[bytes]:
        with path.open("rb") as handle:
            while chunk := handle.read(UPLOAD_CHUNK):
                yield chunk

    return _counted(read(), size, progress)


def _counted(chunks: Iterator[bytes], total: int, progress: Progress | None) -> Iterator[bytes]:
    """``chunks``, calling ``progress(sent, total)`` after each."""
    sent = 0
    for chunk in chunks:
        sent += len(chunk)
        yield chunk
        if progress is not None:
            progress(sent, total)


def _require_json(value: Mapping[str, Any]) -> None:
    """Raise :class:`ValidationFailed` (``loc`` under ``body``) where ``value`` is not strict JSON."""
    problems = json_value_problems(dict(value))
    if problems:
        raise ValidationFailed([FieldError(("body", *path), message, "json_invalid") for path, message in problems])


class HalfcastClient:
    """A client of one Halfcast API at ``url``; ``timeout`` (seconds) applies to each request.

    Event streams use ``stream_timeout`` as their read timeout: it must exceed the
    server's heartbeat interval (15 s by default). ``token`` is the API token (none:
    for a server with authentication off). Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self, url: str = DEFAULT_URL, timeout: float = 10.0, *, stream_timeout: float = 60.0, token: str | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self.stream_timeout = stream_timeout
        headers = {"accept": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.url, timeout=timeout, headers=headers)
        self._jobs: dict[str, tuple[str, JobPublic]] = {}  # job id -> (ETag, resource), for get()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServerUnavailable(
                f"cannot reach the Halfcast API at {self.url}: {type(exc).__name__}: {exc}"
            ) from exc

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._send(method, path, **kwargs)
        raise_for_status(response)
        return response.json()

    # ------------------------------------------------------------------ jobs

    def submit(self, spec: JobSpec | Mapping[str, Any], *, idempotency_key: str | None = None) -> JobPublic:
        """POST a job spec (a :class:`JobSpec` or its JSON as a mapping); the new job resource.

        Raises :class:`ValidationFailed` for a bad spec. A :class:`JobSpec` is sent as the fields it was
        given (``exclude_unset``): the job is the one the same spec as a mapping makes.

        A spec JSON cannot carry (a NaN or infinite float, as YAML's ``.nan``/``.inf`` parse
        to; a YAML date) is refused here, field by field, as the API would, and never sent.
        """
        body = spec.model_dump(mode="json", exclude_unset=True) if isinstance(spec, JobSpec) else dict(spec)
        _require_json(body)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return parse_model(JobPublic, self._request("POST", "/jobs", json=body, headers=headers))

    def get(self, job_id: str) -> JobPublic:
        """The job resource. Raises :class:`NotFound`.

        A job read before is asked for with ``If-None-Match``: while it has not changed
        the API answers ``304`` and the copy kept from last time is returned (a fresh
        copy each call), so polling an idle job costs almost nothing on either side.
        """
        kept = self._jobs.get(job_id)
        response = self._send("GET", f"/jobs/{job_id}", headers={"If-None-Match": kept[0]} if kept else None)
        if response.status_code == 304 and kept is not None:
            return kept[1].model_copy(deep=True)
        raise_for_status(response)
        job = parse_model(JobPublic, response.json())
        self._keep(job_id, response.headers.get("etag"), job)
        return job.model_copy(deep=True)

    def _keep(self, job_id: str, etag: str | None, job: JobPublic) -> None:
        """Remember ``job`` under its ``etag`` (at most :data:`KEPT_JOBS` jobs, the oldest dropped first)."""
        self._jobs.pop(job_id, None)
        if etag is None:
            return
        self._jobs[job_id] = (etag, job)
        while len(self._jobs) > KEPT_JOBS:
            self._jobs.pop(next(iter(self._jobs)))

    def jobs(self, status: str | None = None, page_size: int = 100) -> Iterator[JobPublic]:
        """Every job (of ``status``), newest first, fetched a page at a time."""
        cursor: str | None = None
        while True:
            params: dict[str, str | int] = {"limit": page_size}
            if status is not None:
                params["status"] = status
            if cursor is not None:
                params["cursor"] = cursor
            page = parse_model(JobList, self._request("GET", "/jobs", params=params))
            yield from page.jobs
            cursor = page.next_cursor
            if cursor is None:
                return

    def list(self, status: str | None = None, limit: int = 50) -> Jobs:
        """The newest ``limit`` jobs (of ``status``)."""
        found: Jobs = []
        for job in self.jobs(status, page_size=min(limit, 1000)):
            found.append(job)
            if len(found) >= limit:
                break
        return found

    # From here on, ``list`` in the class's annotations is the method above: the type is ``builtins.list``.

    def metrics(self, job_id: str, after_step: int = 0, page_size: int = 1000) -> Iterator[builtins.list[StepRecord]]:
        """Pages of step records (:class:`~halfcast.contracts.stored.StoredStep`) with ``step > after_step``, in step order."""
        while True:
            page = self._request(
                "GET", f"/jobs/{job_id}/metrics", params={"after_step": after_step, "limit": page_size}
            )
            points: list[StepRecord] = [*parse_model(MetricsPage, page).points]
            if not points:
                return
            yield points
            after_step = points[-1].step
            if len(points) < page_size:
                return

    def evals(self, job_id: str) -> builtins.list[StoredEval]:
        """Every evaluation record of the job, in step order. Raises :class:`NotFound`."""
        return parse_model(EvalList, self._request("GET", f"/jobs/{job_id}/evals")).evals

    def checkpoints(self, job_id: str) -> builtins.list[CheckpointPublic]:
        """The job's checkpoint files, by attempt then step (the last is the newest). Raises :class:`NotFound`."""
        return parse_model(CheckpointList, self._request("GET", f"/jobs/{job_id}/checkpoints")).checkpoints

    def download_checkpoint(
        self, job_id: str, destination: Path, *, name: str | None = None, attempt: int | None = None
    ) -> SavedCheckpoint:
        """Download a checkpoint; its description (as in :meth:`checkpoints`) and the ``path`` it was saved at.

        ``name`` (``final.pt`` or ``step-<N>.pt``) and ``attempt`` pick the file; by default
        the newest (what ``resume_from: <job id>`` would resume from). A ``destination``
        that is a directory gets ``<job id>-attempt-<n>-<name>`` in it. The bytes go to
        ``<path>.part`` and are moved into place once complete and of the announced
        length, so ``path`` is never a partial file.

        Raises:
            NotFound: no such job, or it has no (such) checkpoint.
            ServerUnavailable: the connection failed or the download was cut short.
        """
        listed = [
            c
            for c in self.checkpoints(job_id)
            if (name is None or c.name == name) and (attempt is None or c.attempt == attempt)
        ]
        if not listed:
            what = "checkpoint" if name is None else f"checkpoint {name}"
            where = "" if attempt is None else f" in attempt {attempt}"
            raise NotFound(f"job {job_id} has no {what}{where}", 404)
        chosen = listed[-1]
        path = destination / f"{job_id}-attempt-{chosen.attempt}-{chosen.name}" if destination.is_dir() else destination
        self._save(chosen.url, path, "application/octet-stream")
        return SavedCheckpoint(chosen, path)

    def exports(self, job_id: str) -> builtins.list[ExportPublic]:
        """The job's exports (``adapter``, ``model``), each from the newest attempt that has it. Raises :class:`NotFound`."""
        return parse_model(ExportList, self._request("GET", f"/jobs/{job_id}/exports")).exports

    def download_export(
        self, job_id: str, kind: str, dest_dir: Path, attempt: int | None = None, *, overwrite: bool = False
    ) -> Path:
        """Download the export ``kind`` (``adapter`` or ``model``) and unpack it as the directory ``dest_dir``; its path.

        The tar goes to a staging directory next to ``dest_dir``, its length is checked
        against ``Content-Length``, it is unpacked there (:mod:`halfcast.files.export_extract`
        refuses links, devices, absolute names and ``..``), and the result is renamed to
        ``dest_dir``: never a half-unpacked directory. ``dest_dir`` must not exist or be
        an empty directory, unless ``overwrite``.

        Raises:
            ValueError: ``kind`` is not an export kind.
            FileExistsError: ``dest_dir`` exists and is not empty (and not ``overwrite``).
            NotFound: no such job, or it has no such export (in ``attempt``).
            ServerUnavailable: the connection failed or the download was cut short.
            HalfcastError: the archive was refused as unsafe.
        """
        kind = ExportKind(kind).value
        dest = Path(dest_dir)
        check_destination(dest, overwrite=overwrite)
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent))
        try:
            params = {"attempt": attempt} if attempt is not None else None
            self._save(
                f"/jobs/{job_id}/exports/{kind}",
                staging / "export.tar",
                "application/x-tar",
                params,
                require_length=True,
            )
            tree = extract_export(staging / "export.tar", kind, staging / "tree")
            place_tree(tree, dest, overwrite=overwrite, trash=staging / "replaced")
        except UnsafeArchive as exc:
            raise HalfcastError(f"refused the {kind} export of job {job_id}: {exc}") from exc
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return dest

    def _save(
        self,
        url: str,
        path: Path,
        accept: str,
        params: Mapping[str, str | int | None] | None = None,
        *,
        require_length: bool = False,
    ) -> None:
        """Stream ``url`` into ``path`` (:func:`halfcast.files.download.save_response`), with typed errors."""
        try:
            with self._http.stream("GET", url, params=params, headers={"accept": accept}) as response:
                if response.status_code >= 400:
                    response.read()
                    raise_for_status(response)
                if require_length and "content-length" not in response.headers:
                    raise HalfcastError(f"{url} came without Content-Length: its completeness cannot be checked")
                save_response(response, path)
        except httpx.ConnectError as exc:
            raise ServerUnavailable(f"cannot reach the Halfcast API at {self.url}: {exc}") from exc
        except httpx.TransportError as exc:
            raise ServerUnavailable(f"lost the download of {url} from {self.url}: {exc}") from exc
        except IncompleteDownload as exc:
            raise ServerUnavailable(str(exc)) from exc

    def cancel(self, job_id: str) -> JobPublic:
        """Ask to cancel; the job resource (``cancelled`` or ``cancelling``). Raises :class:`Conflict` if it ended."""
        return parse_model(JobPublic, self._request("POST", f"/jobs/{job_id}/cancel"))

    # ------------------------------------------------------------------ registered datasets and models

    def upload_dataset(
        self,
        path: Path,
        format: str,
        *,
        name: str | None = None,
        file_format: str | None = None,
        progress: Progress | None = None,
        timeout: float = UPLOAD_TIMEOUT_S,
    ) -> DatasetPublic:
        """Upload the dataset file at ``path``, checked by the API against ``format`` (``text``, ``instruction``,
        ``chat``, ``classification``); the registered dataset.

        ``file_format`` (``jsonl`` or ``csv``) defaults from the extension (``.jsonl``/``.json``, ``.csv``);
        ``name`` defaults to the file's name. The file is streamed, never read whole; ``progress(sent,
        total)`` is called as it goes. ``timeout``: seconds to wait for each chunk and for the answer
        (the API checks every row before it answers).

        Raises:
            ValueError: the file format cannot be told from the name.
            ValidationFailed: a bad row (its ``loc`` is ``["body", "line", <line>, <field>]``) or argument.
            QuotaExceeded: the owner's storage quota (``max_storage_bytes``).
            HalfcastError: anything else (``413``: over the server's upload limit).
        """
        kind = file_format or DATASET_EXTENSIONS.get(path.suffix.lower())
        if kind not in DATASET_MEDIA_TYPES:
            raise ValueError(
                f"cannot tell the file format of {path.name}: name it .jsonl, .json or .csv, or pass file_format"
            )
        size = path.stat().st_size
        params = {"format": format, "name": name or path.name}
        chunks = _file_chunks(path, size, progress)
        return parse_model(
            DatasetPublic, self._upload("/datasets", chunks, size, DATASET_MEDIA_TYPES[kind], params, timeout)
        )

    def upload_model(
        self,
        directory: Path,
        *,
        name: str | None = None,
        progress: Progress | None = None,
        timeout: float = UPLOAD_TIMEOUT_S,
    ) -> ModelPublic:
        """Upload the Hugging Face model ``directory`` (``config.json``, ``*.safetensors``, tokenizer files);
        the registered model.

        The directory is sent as an uncompressed tar built on the fly (entries ``model/<file>``, the
        format of ``GET /jobs/{id}/exports/model``: :mod:`halfcast.files.export_tar`) with an exact
        ``Content-Length``; ``progress(sent, total)`` is called as it goes.

        Raises:
            ValueError: ``directory`` is not a directory, or holds a link, a special file, more than
                10,000 files or files nested more than 8 directories deep.
            ValidationFailed: the API refused the archive (the entry at fault in ``loc``).
            QuotaExceeded, HalfcastError: as for :meth:`upload_dataset`.
        """
        tree = read_export(Path(directory), ExportKind.MODEL, 0)
        if tree is None:
            raise ValueError(
                f"cannot upload {directory}: not a directory, or it holds a link, a special file, "
                "more than 10,000 files or files nested too deeply"
            )
        size = archive_size(tree)
        chunks = _counted(stream_archive(tree), size, progress)
        params = {"name": name or Path(directory).resolve().name}
        return parse_model(ModelPublic, self._upload("/models", chunks, size, "application/x-tar", params, timeout))

    def _upload(
        self,
        path: str,
        chunks: Iterator[bytes],
        size: int,
        media_type: str,
        params: Mapping[str, str | int | None],
        timeout: float,
    ) -> Any:
        headers = {"content-type": media_type, "content-length": str(size)}
        limits = httpx.Timeout(self._http.timeout.connect or 10.0, read=timeout, write=timeout, pool=timeout)
        return self._request("POST", path, params=params, content=chunks, headers=headers, timeout=limits)

    def datasets(self, page_size: int = 100) -> Iterator[DatasetPublic]:
        """Every registered dataset the token may see, newest first."""
        for page in self._pages("/datasets", DatasetList, page_size):
            yield from page.datasets

    def dataset(self, dataset_id: str) -> DatasetPublic:
        """One registered dataset. Raises :class:`NotFound`."""
        return parse_model(DatasetPublic, self._request("GET", f"/datasets/{dataset_id}"))

    def delete_dataset(self, dataset_id: str) -> None:
        """Delete a registered dataset. Raises :class:`NotFound`, :class:`Conflict` (a job that has not ended uses it)."""
        raise_for_status(self._send("DELETE", f"/datasets/{dataset_id}"))

    def models(self, page_size: int = 100) -> Iterator[ModelPublic]:
        """Every registered model the token may see, newest first."""
        for page in self._pages("/models", ModelList, page_size):
            yield from page.models

    def model(self, model_id: str) -> ModelPublic:
        """One registered model. Raises :class:`NotFound`."""
        return parse_model(ModelPublic, self._request("GET", f"/models/{model_id}"))

    def delete_model(self, model_id: str) -> None:
        """Delete a registered model. Raises :class:`NotFound`, :class:`Conflict` (a job that has not ended uses it)."""
        raise_for_status(self._send("DELETE", f"/models/{model_id}"))

    def register_export(
        self, job_id: str, *, name: str | None = None, timeout: float = UPLOAD_TIMEOUT_S
    ) -> ModelPublic:
        """Register the job's exported model (``export/model``) as a model of the job's owner; the model.

        Raises :class:`NotFound` (no such job, or no model export) and :class:`Conflict` (an export
        the registry refuses).
        """
        params = {"name": name} if name else None
        body = self._request("POST", f"/jobs/{job_id}/exports/model/register", params=params, timeout=timeout)
        return parse_model(ModelPublic, body)

    def _pages(self, path: str, model: type[RegistryPage], page_size: int) -> Iterator[RegistryPage]:
        """The pages of ``path`` as ``model``, following ``next_cursor`` to the last."""
        cursor: str | None = None
        while True:
            params: dict[str, str | int] = {"limit": page_size, **({"cursor": cursor} if cursor else {})}
            page = parse_model(model, self._request("GET", path, params=params))
            yield page
            cursor = page.next_cursor
            if cursor is None:
                return

    # ------------------------------------------------------------------ audit

    def audit(self, *, limit: int = 50, action: str | None = None, cursor: str | None = None) -> AuditList:
        """One page of the audit log, newest first (``events``, ``next_cursor``). Raises :class:`Forbidden` for a non-admin."""
        params: dict[str, str | int] = {"limit": limit}
        if action is not None:
            params["action"] = action
        if cursor is not None:
            params["cursor"] = cursor
        return parse_model(AuditList, self._request("GET", "/audit", params=params))

    def whoami(self) -> SessionPublic:
        """Whom the token belongs to (``owner``) and whether it is an admin's. Raises :class:`Unauthorized` for a bad token."""
        return parse_model(SessionPublic, self._request("GET", "/session"))

    # ------------------------------------------------------------------ events

    def events(self, job_id: str, after_step: int = 0, *, reconnects: int = 5) -> Iterator[JobEvent]:
        """The job's event stream (``status``, ``step``, ``eval``, ``rewind``, ``precision_switch``: their ``data``
        :data:`halfcast.contracts.events.JOB_EVENTS`) until its terminal ``status`` event.

        A dropped connection is resumed with ``Last-Event-ID`` (so no step is lost or
        repeated), up to ``reconnects`` times in a row; then :class:`ServerUnavailable`.
        """
        last_id = str(after_step)
        failures = 0
        while True:
            try:
                for event in self._stream(job_id, last_id):
                    failures = 0
                    if event.id is not None:
                        last_id = event.id
                    yield event
                    if isinstance(event.data, JobPublic) and event.data.status.terminal:
                        return
            except (httpx.TransportError, ServerUnavailable) as exc:
                failures += 1
                if failures > reconnects:
                    raise ServerUnavailable(f"lost the event stream of job {job_id} at {self.url}: {exc}") from exc
                log.warning("event stream of job %s dropped (%s); resuming after step %s", job_id, exc, last_id)
                time.sleep(min(2.0, 0.2 * 2**failures))
                continue
            # The server closed the stream without a terminal status (e.g. a restart): resume.
            failures += 1
            if failures > reconnects:
                raise ServerUnavailable(f"the event stream of job {job_id} keeps ending early")

    # ------------------------------------------------------------------ logs

    def logs(self, job_id: str, *, rank: int = 0, tail: int = 200, attempt: int | None = None) -> LogLines:
        """The last ``tail`` lines of ``rank``'s log (newest attempt by default).

        Raises :class:`NotFound` (unknown job, or one that never started),
        :class:`Conflict` (not started yet), :class:`ValidationFailed` (a rank or
        attempt the job does not have).
        """
        params: dict[str, str | int] = {"rank": rank, "tail": tail}
        if attempt is not None:
            params["attempt"] = attempt
        return parse_model(LogLines, self._request("GET", f"/jobs/{job_id}/logs", params=params))

    def follow_logs(
        self, job_id: str, *, rank: int = 0, tail: int = 200, attempt: int | None = None
    ) -> Iterator[LogEvent]:
        """Follow ``rank``'s log: ``attempt``, ``lines`` (``data.lines``) and finally ``end`` events
        (their ``data``: :data:`halfcast.contracts.events.LOG_EVENTS`).

        Waits for a queued job to start, moves on to a retry's attempt (unless
        ``attempt`` is given) and returns after ``end``. A dropped connection is not
        resumed: :class:`ServerUnavailable`.
        """
        params: dict[str, str | int] = {"rank": rank, "tail": tail, "follow": "true"}
        if attempt is not None:
            params["attempt"] = attempt
        try:
            for event in typed_events(self._sse(f"/jobs/{job_id}/logs", params=params), LOG_EVENTS):
                yield event
                if event.event == "end":
                    return
        except httpx.TransportError as exc:
            raise ServerUnavailable(f"lost the log stream of job {job_id} at {self.url}: {exc}") from exc
        raise ServerUnavailable(f"the log stream of job {job_id} ended early")

    def _sse(
        self, path: str, params: Mapping[str, str | int | None] | None = None, headers: dict[str, str] | None = None
    ) -> Iterator[Event[Any]]:
        """The events of one SSE answer from ``path`` (typed errors for an error status)."""
        timeout = httpx.Timeout(self._http.timeout.connect or 10.0, read=self.stream_timeout)
        headers = {"accept": "text/event-stream", **(headers or {})}
        try:
            with self._http.stream("GET", path, params=params, headers=headers, timeout=timeout) as response:
                if response.status_code >= 400:
                    response.read()
                    raise_for_status(response)
                yield from parse_sse(response.iter_lines())
        except httpx.ConnectError as exc:
            raise ServerUnavailable(f"cannot reach the Halfcast API at {self.url}: {exc}") from exc

    def _stream(self, job_id: str, last_id: str) -> Iterator[JobEvent]:
        yield from typed_events(self._sse(f"/jobs/{job_id}/events", headers={"Last-Event-ID": last_id}), JOB_EVENTS)
