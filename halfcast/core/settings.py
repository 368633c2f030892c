"""Settings for the API, the worker and the CLI, read from ``HALFCAST_*`` environment variables.

The embedded default needs no server: a SQLite file and a filesystem Celery broker
under ``data_dir``. Point ``database_url`` at Postgres and ``broker_url`` at Redis
for the production layout.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterator, Mapping
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from halfcast.common.redact import redact_urls
from halfcast.core.data_dir import DEFAULT_DATA_DIR
from halfcast.core.db.engine import StatementTimeouts

#: Settings that may hold a password (inside a URL): masked in ``repr`` and ``str``.
SECRET_URL_FIELDS = frozenset({"database_url", "broker_url"})
#: The longest a worker's session may sit idle in a transaction, as a fraction of ``lease_ttl_s``.
WORKER_IDLE_IN_TRANSACTION_LEASE_FRACTION = 0.5
#: Database URL schemes Halfcast connects to PostgreSQL with through psycopg 3 (``make_engine``).
PSYCOPG_SCHEMES = frozenset({"postgresql", "postgres", "postgresql+psycopg"})


class PollReads(enum.StrEnum):
    """How long ``GET /jobs/{id}`` may keep a read (``HALFCAST_POLL_READS``; :mod:`server.http.recent_reads`)."""

    AUTO = "auto"  # notified on PostgreSQL through psycopg, else database (Settings.effective_poll_reads)
    DATABASE = "database"  # every poll reads the database (or reuses a read for ``poll_max_age_s``)
    NOTIFIED = "notified"  # a read is kept until PostgreSQL notifies a change of the job or the token


class Settings(BaseSettings):
    """All of Halfcast's settings. Build with ``Settings()``; nothing is read at import time."""

    model_config = SettingsConfigDict(env_prefix="HALFCAST_", extra="ignore")

    data_dir: Path = Field(default=DEFAULT_DATA_DIR, description="Embedded database, broker and run directories")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; default SQLite under data_dir")
    broker_url: str | None = Field(default=None, description="Celery broker URL; default filesystem:// under data_dir")
    host: str = "127.0.0.1"
    auth: bool = Field(
        default=True,
        description="Require a bearer token on the API (off: only when the API listens on a loopback address)",
    )
    port: int = Field(default=8000, ge=1, le=65535)
    allow_faults: bool = Field(default=False, description="Accept the spec's test-only `faults` block")
    data_roots: list[Path] = Field(default_factory=list, description="Directories text datasets may read from")
    model_roots: list[Path] = Field(
        default_factory=list, description="Directories hf models and tokenizers may be loaded from"
    )
    worker_concurrency: int = Field(default=2, ge=1, le=256, description="CPU jobs (gpus 0) one worker runs at once")
    run_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="Niceness added to every run's processes (torchrun or the warm standby, launchers, ranks): the API"
        " and the worker keep the CPU on a host that trains; 0: runs get the worker's own priority",
    )
    warm_start: bool = Field(
        default=True,
        description="Keep a standby Python with torch and the trainer imported that forks the next CPU job's ranks",
    )
    worker_gpus: str | None = Field(
        default=None,
        description='GPU indices this worker hands to jobs: "0,1,2,3", "none", or unset to discover them',
    )
    gpu_lock_dir: Path | None = Field(
        default=None, description="Folder of the per-GPU lock files (host-wide); default <data_dir>/gpu-locks"
    )
    worker_slot_wait_s: float = Field(
        default=10.0,
        ge=0.0,
        le=3600.0,
        description="Seconds a task waits for free slots before handing its message back to the queue",
    )
    worker_heartbeat_s: float = Field(default=5.0, gt=0.0, le=3600.0, description="Seconds between worker heartbeats")
    worker_live_s: float = Field(
        default=15.0, gt=0.0, le=86_400.0, description="A worker is live while its last heartbeat is younger than this"
    )
    worker_forget_s: float = Field(
        default=600.0,
        gt=0.0,
        le=30 * 86_400.0,
        description="Seconds after its last heartbeat a worker is dropped from the registry",
    )
    worker_poll_interval_s: float = Field(default=0.1, gt=0.0, le=60.0)
    worker_progress_interval_s: float = Field(
        default=1.0,
        ge=0.0,
        le=60.0,
        description="Seconds at least between two writes of a running job's step to its row (step records are "
        "stored every poll; 0: the row too)",
    )
    worker_host_address: str | None = Field(
        default=None,
        max_length=255,
        description="The address other workers reach this one at for multi-node jobs (default: this host's address "
        "on the route to the database)",
    )
    rendezvous_port_min: int = Field(
        default=29_500,
        ge=1024,
        le=65_535,
        description="Lowest port node 0 of a multi-node job may hold for its rendezvous: keep the range outside the "
        "kernel's ephemeral ports (net.ipv4.ip_local_port_range), which a client connection may take",
    )
    rendezvous_port_max: int = Field(
        default=29_999, ge=1024, le=65_535, description="Highest rendezvous port (see rendezvous_port_min)"
    )
    cancel_grace_s: float = Field(default=10.0, ge=0.0, le=3600.0)
    queue_name: str = "halfcast"
    lease_ttl_s: float = Field(
        default=30.0, ge=1.0, le=3600.0, description="Seconds a job's lease lasts unless its worker renews it"
    )
    reaper_interval_s: float = Field(
        default=10.0, gt=0.0, le=3600.0, description="Seconds between two looks for expired leases in each worker"
    )
    broker_visibility_timeout_s: float = Field(
        default=3600.0,
        ge=1.0,
        le=30 * 24 * 3600.0,
        description="Redis: seconds before a delivered, unacknowledged message is delivered again",
    )
    quota_max_active_jobs: int | None = Field(
        default=None, ge=0, description="Default per-owner limit on jobs not yet terminal (unset: unlimited)"
    )
    quota_max_gpus: int | None = Field(
        default=None,
        ge=0,
        description="Default per-owner limit on the GPUs of jobs not yet terminal (unset: unlimited)",
    )
    quota_max_queued_jobs: int | None = Field(
        default=None, ge=0, description="Default per-owner limit on queued jobs (unset: unlimited)"
    )
    quota_max_storage_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Default per-owner limit on the bytes of registered datasets and models (unset: unlimited)",
    )
    max_upload_bytes: int = Field(
        default=16 << 30,
        ge=1,
        le=1 << 42,
        description="Largest dataset file or model archive POST /datasets and POST /models accept (413 beyond)",
    )
    upload_min_rate_bytes_per_s: float = Field(
        default=16_384.0,
        ge=0.0,
        le=1e12,
        description="Slowest average rate an upload body may arrive at once its grace has passed (408 below it)",
    )
    upload_rate_grace_s: float = Field(
        default=30.0, gt=0.0, le=86_400.0, description="Seconds an upload may send below the minimum rate at first"
    )
    upload_idle_timeout_s: float = Field(
        default=30.0, gt=0.0, le=86_400.0, description="Seconds an upload body may send nothing before it gets 408"
    )
    max_concurrent_uploads: int = Field(
        default=32, ge=1, le=10_000, description="Uploads one API process takes at once (503 past it)"
    )
    max_concurrent_uploads_per_owner: int = Field(
        default=2, ge=1, le=10_000, description="Uploads of one owner one API process takes at once (429 past it)"
    )
    api_workers: int = Field(
        default=1, ge=1, le=64, description="API processes `halfcast api` and `halfcast up` run (uvicorn workers)"
    )
    poll_max_age_s: float = Field(
        default=0.0,
        ge=0.0,
        le=10.0,
        description="Seconds GET /jobs/{id} may reuse a read of the same job and token (0: every poll reads the"
        " database); writes through the same API process are seen at once",
    )
    poll_reads: PollReads = Field(
        default=PollReads.AUTO,
        description="notified: GET /jobs/{id} keeps a read until PostgreSQL notifies a change of the job or the"
        " token (PostgreSQL only; poll_max_age_s applies while the notifications are down); database: it does not;"
        " auto: notified on PostgreSQL, database on SQLite",
    )
    api_max_concurrency: int = Field(
        default=16,
        ge=1,
        le=10_000,
        description="Requests one API process works on at once (health probes and cancels aside); more wait in line",
    )
    api_max_queue: int = Field(
        default=512, ge=0, le=100_000, description="Requests one API process lets wait in line; past it they get 503"
    )
    api_queue_timeout_s: float = Field(
        default=3.0, gt=0.0, le=300.0, description="Seconds a request may wait in line before it gets 503"
    )
    db_pool_size: int = Field(default=10, ge=1, le=1000, description="Database connections one API process keeps open")
    db_max_overflow: int = Field(
        default=20, ge=0, le=1000, description="Extra database connections one API process may open under load"
    )
    db_pool_timeout_s: float = Field(
        default=5.0,
        gt=0.0,
        le=300.0,
        description="Seconds an API request waits for a free database connection before it gets 503",
    )

    db_statement_timeout_s: float = Field(
        default=60.0,
        ge=0.0,
        le=86_400.0,
        description="PostgreSQL: seconds a statement may run before it is cancelled (0: no limit)",
    )
    db_lock_timeout_s: float = Field(
        default=10.0,
        ge=0.0,
        le=86_400.0,
        description="PostgreSQL: seconds a statement may wait for a lock (a row another session holds) (0: no limit)",
    )
    db_idle_in_transaction_timeout_s: float = Field(
        default=120.0,
        ge=0.0,
        le=86_400.0,
        description="PostgreSQL: seconds a session may sit idle inside a transaction before it is ended (0: no limit)",
    )

    def statement_timeouts(self) -> StatementTimeouts:
        """The PostgreSQL connection timeouts of the API's and the worker's engines (``0``: none)."""
        return StatementTimeouts(
            self.db_statement_timeout_s or None,
            self.db_lock_timeout_s or None,
            self.db_idle_in_transaction_timeout_s or None,
        )

    def worker_statement_timeouts(self) -> StatementTimeouts:
        """The worker engine's timeouts: :meth:`statement_timeouts`, a session idle in a transaction ended within
        half a lease (:data:`WORKER_IDLE_IN_TRANSACTION_LEASE_FRACTION` of ``lease_ttl_s``, at least 1 s).

        A worker cut off by a network partition in the middle of a transaction leaves it open on the server,
        which hears nothing of the lost connection, with its row locks held: the job's row among them, which
        the reaper must update once the lease expires (its updates wait ``db_lock_timeout_s`` and give up).
        With ``db_idle_in_transaction_timeout_s`` (120 s) alone, a partitioned node's job stayed ``running``
        that long; ended within half a lease, the session frees the row before the lease runs out, whatever the
        setting (``0`` included: the bound is what makes leases work).
        """
        timeouts = self.statement_timeouts()
        bound = max(1.0, self.lease_ttl_s * WORKER_IDLE_IN_TRANSACTION_LEASE_FRACTION)
        idle = timeouts.idle_in_transaction_s
        return replace(timeouts, idle_in_transaction_s=bound if idle is None else min(idle, bound))

    @model_validator(mode="after")
    def _notified_on_postgresql(self) -> Settings:
        if self.poll_reads is PollReads.NOTIFIED and self.database_scheme not in PSYCOPG_SCHEMES:
            msg = (
                "poll_reads=notified needs PostgreSQL through psycopg (database_url postgresql+psycopg://...):"
                f" {self.database_scheme} notifies nothing"
            )
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _rendezvous_range(self) -> Settings:
        if self.rendezvous_port_min > self.rendezvous_port_max:
            msg = f"rendezvous_port_min {self.rendezvous_port_min} is above rendezvous_port_max {self.rendezvous_port_max}"
            raise ValueError(msg)
        return self

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        """pydantic's ``repr``/``str`` fields, with the passwords in the service URLs masked."""
        for name, value in super().__repr_args__():
            yield name, redact_urls(value) if name in SECRET_URL_FIELDS and isinstance(value, str) else value

    @cached_property
    def resolved_data_dir(self) -> Path:
        """``data_dir`` made absolute."""
        return self.data_dir.expanduser().resolve()

    @property
    def runs_dir(self) -> Path:
        """Where each job attempt gets its run directory (spec, step records, checkpoints, logs)."""
        return self.resolved_data_dir / "runs"

    @property
    def registry_dir(self) -> Path:
        """Where registered datasets and models live (``datasets/``, ``models/``): shared like ``runs_dir``."""
        return self.resolved_data_dir / "registry"

    @property
    def effective_database_url(self) -> str:
        """``database_url``, or the embedded SQLite file under ``data_dir``."""
        return self.database_url or f"sqlite:///{self.resolved_data_dir / 'halfcast.db'}"

    @property
    def effective_poll_reads(self) -> PollReads:
        """``poll_reads``, ``auto`` resolved: ``notified`` where the database is PostgreSQL through psycopg
        (what the change feed listens with), else ``database``."""
        if self.poll_reads is not PollReads.AUTO:
            return self.poll_reads
        return PollReads.NOTIFIED if self.database_scheme in PSYCOPG_SCHEMES else PollReads.DATABASE

    @property
    def database_scheme(self) -> str:
        """The scheme of :attr:`effective_database_url` (``sqlite``, ``postgresql+psycopg``...)."""
        return self.effective_database_url.partition("://")[0]

    @property
    def effective_broker_url(self) -> str:
        """``broker_url``, or kombu's ``filesystem://`` transport (folders under ``data_dir``)."""
        return self.broker_url or "filesystem://"

    @property
    def resolved_gpu_lock_dir(self) -> Path:
        """``gpu_lock_dir``, or ``<data_dir>/gpu-locks``; workers sharing a host's GPUs must share it."""
        return (self.gpu_lock_dir or self.resolved_data_dir / "gpu-locks").expanduser().resolve()

    @property
    def broker_dir(self) -> Path:
        """Folder of the embedded filesystem broker."""
        return self.resolved_data_dir / "broker"


def settings_with_overrides(overrides: Mapping[str, object | None]) -> Settings:
    """Write each override that is not ``None`` (``HALFCAST_*`` name -> value) into this process's environment,
    so every process it starts sees the same settings; return the resulting settings.

    ``HALFCAST_DATA_DIR`` is always set afterwards (to the resolved data directory), so a child started from
    another working directory still finds the same one.
    """
    for name, value in overrides.items():
        if value is not None:
            os.environ[name] = str(value)
    settings = Settings()
    os.environ.setdefault("HALFCAST_DATA_DIR", str(settings.resolved_data_dir))
    return settings
