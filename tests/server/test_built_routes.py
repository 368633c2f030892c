"""The app takes its routers' routes as declared (server/http/built_routes.py): same API, nothing built again."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import APIRouter, FastAPI

import server.app
import server.routes.dashboard
import server.routes.events
import server.routes.logs
from halfcast.core.settings import Settings
from server.app import create_app
from server.http.built_routes import RouterNotFlatError, add_built_routes
from server.routes import job_resource, jobs

USERS_OF_THE_HELPER = (server.app, server.routes.dashboard, server.routes.events, server.routes.logs)


def _included(app: FastAPI, router: APIRouter) -> None:
    app.include_router(router)


def test_the_openapi_description_is_that_of_included_routers(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(auth=True)
    built = create_app(settings).openapi()
    for module in USERS_OF_THE_HELPER:
        monkeypatch.setattr(module, "add_built_routes", _included)
    included = create_app(settings).openapi()

    assert built == included
    assert len(built["paths"]) >= 20


def test_the_app_serves_the_declared_route_objects() -> None:
    app = create_app(Settings(auth=True))
    served = {id(route) for route in app.routes}

    for router in (job_resource.router, jobs.router, server.routes.events.router, server.routes.logs.router):
        assert router.routes and all(id(route) in served for route in router.routes)


def test_a_router_with_frontend_routes_is_refused(tmp_path: Path) -> None:
    router = APIRouter()
    router.frontend("/", directory=tmp_path, check_dir=False)

    with pytest.raises(RouterNotFlatError):
        add_built_routes(FastAPI(), router)
