"""The web dashboard: ``GET /`` serves ``server/static/index.html``; ``/static`` serves the assets.

Everything the page needs (its scripts, the vendored uPlot and js-yaml, see
``server/static/vendor/README.md``) ships as package data, so the dashboard works
on machines without internet access. The page itself talks to the JSON API and the
event stream; the server keeps no dashboard state.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from server.http.built_routes import add_built_routes

router = APIRouter(tags=["dashboard"])


def static_dir() -> Path:
    """The folder of the dashboard's files inside the installed ``server`` package."""
    return Path(str(files("server").joinpath("static")))


@router.get("/", include_in_schema=False)
def index() -> FileResponse:
    """The dashboard's single page (its routes live in the URL fragment: ``#/jobs/<id>``, ``#/submit``, ``#/datasets``...)."""
    return FileResponse(static_dir() / "index.html", headers={"Cache-Control": "no-cache"})


def install(app: FastAPI) -> None:
    """Serve the dashboard at ``/`` and its assets under ``/static``."""
    add_built_routes(app, router)
    app.mount("/static", StaticFiles(directory=static_dir()), name="static")
