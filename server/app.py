"""The FastAPI application factory. Run with ``uvicorn --factory server.app:create_app``.

Nothing is built at import time: the lifespan creates the engine, the session
factory, the job queue and the Prometheus registry and keeps them on ``app.state``.
The schema is not created here; apply the migrations first
(``halfcast.core.db.migrate.upgrade_database``); ``/readyz`` reports a database that is behind.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from sqlalchemy import Engine

from halfcast.common.redact import install_log_redaction
from halfcast.core.db.change_feed import ChangeFeed
from halfcast.core.db.engine import API_PING_AFTER_IDLE_S, PoolLimits, make_engine, make_session_factory
from halfcast.core.db.job_readers import JobReads, async_connector, job_reads_for
from halfcast.core.settings import PollReads, Settings
from server.auth import check_exposure
from server.http.admission import AdmissionCollector, AdmissionMiddleware, Limiter
from server.http.body_errors import install_body_error_handlers
from server.http.body_limit import MAX_BODY_BYTES, BodySizeLimitMiddleware
from server.http.built_routes import add_built_routes
from server.http.errors import install_error_handlers
from server.http.openapi_errors import declare_error_responses
from server.http.recent_reads import ForgetOnWrite, RecentJobReads
from server.http.request_metrics import RequestMetricsMiddleware, request_histogram
from server.metrics.exporter import build_registry
from server.metrics.poll_reads import PollReadsCollector
from server.metrics.streams import StreamCollector
from server.metrics.worker_metrics import WorkerMetricsCollector
from server.queue import CeleryJobQueue, JobQueue
from server.registry.upload_gate import UploadGate
from server.routes import (
    audit,
    checkpoints,
    dashboard,
    datasets,
    events,
    exports,
    health,
    job_poll,
    job_resource,
    jobs,
    logs,
    metrics,
    models,
    session,
    workers,
)

log = logging.getLogger(__name__)

#: Where the interactive API docs (/docs, /redoc) load Swagger UI and ReDoc from: this server.
DOCS_ASSETS_URL = "/docs/assets"


def keeps_reads(settings: Settings) -> bool:
    """Whether ``GET /jobs/{id}`` may answer from a kept read: polls notified (``auto`` on PostgreSQL) or
    ``poll_max_age_s`` set."""
    return settings.effective_poll_reads is PollReads.NOTIFIED or settings.poll_max_age_s > 0


def poll_reads(reads: JobReads, settings: Settings) -> JobReads:
    """``GET /jobs/{id}``'s reads: ``reads``, kept a while if :func:`keeps_reads` (:mod:`server.http.recent_reads`).

    Kept ``poll_max_age_s`` until a change feed tells them (:func:`follow_changes`), then until a change.
    """
    return RecentJobReads(reads, settings.poll_max_age_s) if keeps_reads(settings) else reads


@asynccontextmanager
async def follow_changes(settings: Settings, engine: Engine, reads: JobReads) -> AsyncIterator[ChangeFeed | None]:
    """With polls notified (:attr:`Settings.effective_poll_reads`): a :class:`ChangeFeed` telling ``reads``
    (a :class:`RecentJobReads`), run meanwhile."""
    if settings.effective_poll_reads is not PollReads.NOTIFIED or not isinstance(reads, RecentJobReads):
        yield None
        return
    connect = async_connector(engine)
    if connect is None:
        raise RuntimeError(f"poll_reads=notified needs PostgreSQL through psycopg, not {engine.url.drivername}")
    feed = ChangeFeed(connect, reads)
    async with feed.running():
        yield feed


def recent_reads(app: FastAPI) -> RecentJobReads | None:
    """The app's reads if they are kept (:func:`keeps_reads`) and the app has started, else ``None``."""
    reads = getattr(app.state, "job_reads", None)
    return reads if isinstance(reads, RecentJobReads) else None


def _lifespan(settings: Settings, queue: JobQueue | None) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The lifespan: build shared resources on start, release them on shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.resolved_data_dir.mkdir(parents=True, exist_ok=True)
        engine = make_engine(
            settings.effective_database_url,
            pool_limits(settings),
            ping_after_idle_s=API_PING_AFTER_IDLE_S,
            timeouts=settings.statement_timeouts(),
        )
        own_queue = CeleryJobQueue(settings) if queue is None else None
        app.state.settings = settings
        app.state.engine = engine
        app.state.session_factory = make_session_factory(engine)
        app.state.job_reads = poll_reads(
            job_reads_for(engine, poll_pool_limits(settings), ping_after_idle_s=API_PING_AFTER_IDLE_S), settings
        )
        app.state.queue = own_queue or queue
        app.state.registry = build_registry(app.state.session_factory)
        app.state.registry.register(StreamCollector(app.state.event_streams, "event"))
        app.state.registry.register(StreamCollector(app.state.log_streams, "log"))
        app.state.registry.register(app.state.request_histogram)
        app.state.registry.register(AdmissionCollector(app.state.limiter))
        app.state.registry.register(
            WorkerMetricsCollector(app.state.session_factory, settings.worker_live_s, settings.worker_forget_s)
        )
        log.info("halfcast API ready (database %s)", engine.url.render_as_string(hide_password=True))
        try:
            async with follow_changes(settings, engine, app.state.job_reads) as feed:
                app.state.change_feed = feed
                app.state.registry.register(PollReadsCollector(recent_reads(app), feed))
                yield
        finally:
            if own_queue is not None:
                own_queue.close()
            await app.state.job_reads.close()
            engine.dispose()

    return lifespan


def pool_limits(settings: Settings) -> PoolLimits:
    """The API's database pool: ``HALFCAST_DB_POOL_SIZE``, ``HALFCAST_DB_MAX_OVERFLOW``, ``HALFCAST_DB_POOL_TIMEOUT_S``."""
    return PoolLimits(settings.db_pool_size, settings.db_max_overflow, settings.db_pool_timeout_s)


def poll_pool_limits(settings: Settings) -> PoolLimits:
    """``GET /jobs/{id}``'s own pool on PostgreSQL: :func:`pool_limits`, at most ``HALFCAST_API_MAX_CONCURRENCY`` open.

    Admission lets no more requests in at once, and a poll holds one connection, so more could never be used.
    """
    limits = pool_limits(settings)
    most = min(limits.size + limits.max_overflow, settings.api_max_concurrency)
    size = min(limits.size, most)
    return PoolLimits(size, most - size, limits.timeout_s)


def admission_limiter(settings: Settings) -> Limiter:
    """The API's admission limits: ``HALFCAST_API_MAX_CONCURRENCY``, ``_MAX_QUEUE``, ``_QUEUE_TIMEOUT_S``."""
    return Limiter(settings.api_max_concurrency, settings.api_max_queue, settings.api_queue_timeout_s)


def create_app(settings: Settings | None = None, queue: JobQueue | None = None) -> FastAPI:
    """Build the API for ``settings`` (default: from ``HALFCAST_*``) and ``queue`` (default: Celery).

    Every route but the probes, the dashboard's files, the OpenAPI description and the
    docs (``/openapi.json``, ``/docs``, ``/redoc``, their scripts served here, never from a
    CDN) needs a token (:mod:`server.auth`). Raises :class:`server.auth.ExposureError`
    when authentication is off and ``settings.host`` is not a loopback address.
    """
    settings = settings or Settings()
    check_exposure(settings)
    install_log_redaction()  # after uvicorn configured logging; idempotent
    app = FastAPIOffline(  # /docs and /redoc with their scripts served here, not from a CDN
        static_url=DOCS_ASSETS_URL,
        title="Halfcast",
        summary="Training as a service: mixed-precision jobs with automatic loss scaling",
        version="0.1.0",
        lifespan=_lifespan(settings, queue),
    )
    app.state.limiter = admission_limiter(settings)
    app.state.upload_gate = UploadGate(settings.max_concurrent_uploads, settings.max_concurrent_uploads_per_owner)
    app.state.rendered_bodies = job_resource.RenderedBodies()  # GET /jobs/{id}'s bodies by ETag
    if keeps_reads(settings):  # innermost: a write forgets the polls' kept reads as its answer starts
        app.add_middleware(ForgetOnWrite, reads=lambda: recent_reads(app))
    # then: a poll, once admitted, skips the router (HEAD and everything else: FastAPI)
    app.add_middleware(job_poll.JobPollShortcut, route=job_resource.resource_route())
    app.add_middleware(AdmissionMiddleware, limiter=app.state.limiter)  # inside the body limit: bodies are read first
    uploads = {
        ("POST", datasets.UPLOAD_PATH): settings.max_upload_bytes,
        ("POST", models.UPLOAD_PATH): settings.max_upload_bytes,
    }
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=MAX_BODY_BYTES, streamed=uploads)
    app.state.request_histogram = request_histogram()
    app.add_middleware(RequestMetricsMiddleware, histogram=app.state.request_histogram)
    install_error_handlers(app)
    install_body_error_handlers(app)
    add_built_routes(app, job_resource.router)
    add_built_routes(app, jobs.router)
    add_built_routes(app, checkpoints.router)
    add_built_routes(app, exports.router)
    add_built_routes(app, datasets.router)
    add_built_routes(app, models.router)
    add_built_routes(app, health.router)
    add_built_routes(app, metrics.router)
    add_built_routes(app, workers.router)
    add_built_routes(app, audit.router)
    add_built_routes(app, session.router)
    events.install(app)
    logs.install(app)
    dashboard.install(app)
    declare_error_responses(app)  # after every router: 401/403/413/503 by dependency
    return app
