"""The dashboard's files: served by the API, self-contained (no CDN), shipped as package data."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from fastapi.testclient import TestClient

from server.routes.dashboard import static_dir

ROOT = Path(__file__).resolve().parents[2]


def test_the_page_and_every_asset_it_names_are_served(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text)
    assert "/static/app.js" in assets and "/static/vendor/uplot/uPlot.iife.min.js" in assets
    for module in static_dir().glob("*.js"):
        assets += [f"/static/{name}" for name in re.findall(r'from "\./([^"]+)"', module.read_text())]
    for asset in set(assets):
        response = client.get(asset)
        assert response.status_code == 200, asset
        assert response.content, asset
    assert (
        client.get("/static/app.js").headers["content-type"].startswith(("text/javascript", "application/javascript"))
    )


def test_nothing_is_loaded_from_another_host() -> None:
    own = [static_dir() / "index.html", *static_dir().glob("*.js"), *static_dir().glob("*.css")]
    for path in own:
        text = path.read_text()
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), path
        assert not re.search(r"""(fetch|EventSource|import)\s*\(\s*["'`](https?:)?//""", text), path


def test_package_data_covers_every_static_file() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["server"]
    package = ROOT / "server"
    shipped = {path for pattern in globs for path in package.glob(pattern) if path.is_file()}
    files = {path for path in static_dir().rglob("*") if path.is_file()}
    assert files and files <= shipped, sorted(str(path.relative_to(package)) for path in files - shipped)
    vendor = static_dir() / "vendor"
    assert (vendor / "uplot" / "LICENSE").exists() and (vendor / "js-yaml" / "LICENSE").exists()
