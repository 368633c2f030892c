"""Add a module's router to an app with the routes it already built, not built again for every app.

FastAPI 0.165's ``include_router`` keeps the router and builds each of its routes again (dependencies,
request and response models: pydantic adapters) for the including app, on the app's first request:
about 0.1 s per app on this 2-core machine, paid by the first caller of each API process and by every
test that makes an app. A route on a module's ``APIRouter`` is complete when it is declared: the
router's prefix, tags and dependencies are already in it. So the app takes those very route objects,
as ``include_router`` did before FastAPI wrapped included routers; the OpenAPI description is the same
(tests/server/test_built_routes.py).

Not for a router with routes of its own app-level kind (low-priority or frontend routes), nor for an
app that relies on ``app.dependency_overrides``: the routes keep their router as override provider.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI


class RouterNotFlatError(ValueError):
    """The router has routes that only ``include_router`` places (low-priority or frontend routes)."""


def add_built_routes(app: FastAPI, router: APIRouter) -> None:
    """Append ``router``'s route objects to ``app``'s, as they were built when declared."""
    if router._low_priority_routes or router._frontend_routes is not None:  # FastAPI has no public accessor
        raise RouterNotFlatError(f"{router!r}: use app.include_router for low-priority or frontend routes")
    app.router.routes.extend(router.routes)
