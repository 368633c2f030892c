"""Liveness (``/healthz``) and readiness (``/readyz``) probes."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from halfcast.common.redact import redact_urls
from server.probes import check_broker, check_database

log = logging.getLogger(__name__)

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (checks nothing else; answered on the event loop, no worker thread needed)."""
    return {"status": "ok"}


def _outcome(name: str, probe: Callable[[], None]) -> str:
    try:
        probe()
    except Exception as exc:  # noqa: BLE001  # a probe reports any failure as "down", it never raises
        log.warning("readiness: %s is down: %s", name, redact_urls(str(exc)))
        return redact_urls(f"down: {type(exc).__name__}: {exc}")
    return "ok"


@router.get("/readyz", responses={503: {"description": "A dependency is down; `detail` names it"}})
def readyz(request: Request) -> JSONResponse:
    """The database answers (at the newest schema) and the broker is reachable; else 503 naming what is down."""
    state = request.app.state
    checks = {
        "database": _outcome("database", lambda: check_database(state.engine)),
        "broker": _outcome("broker", lambda: check_broker(state.settings)),
    }
    down = [name for name, outcome in checks.items() if outcome != "ok"]
    if down:
        return JSONResponse({"detail": f"not ready: {', '.join(down)} down", "checks": checks}, status_code=503)
    return JSONResponse({"status": "ready", "checks": checks})
