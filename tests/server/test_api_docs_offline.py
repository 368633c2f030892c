"""The interactive API docs work on a host with no Internet access: every script and style comes from this server.

FastAPI's default /docs and /redoc pages load Swagger UI and ReDoc from a CDN, so an
operator on an air-gapped cluster got a blank page.
"""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

#: ``src``/``href`` attributes of the page (scripts, styles, icons).
ASSETS = re.compile(r"""(?:src|href)=["']([^"']+)["']""")
#: The bundle's own version stamp (``PACKAGE_VERSION:"5.32.6"``).
SWAGGER_VERSION = re.compile(r'PACKAGE_VERSION:"(\d+)\.')


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_every_asset_from_this_server(client: TestClient, page: str) -> None:
    html = client.get(page)
    assert html.status_code == 200 and "text/html" in html.headers["content-type"]
    assets = ASSETS.findall(html.text)
    assert assets, html.text
    for url in assets:
        assert url.startswith("/"), f"{page} loads {url} from elsewhere"
        assert client.get(url).status_code == 200, url


def test_swagger_ui_renders_this_apis_description(client: TestClient) -> None:
    html = client.get("/docs").text
    assert "SwaggerUIBundle" in html and "/openapi.json" in html
    bundle = client.get("/docs/assets/swagger-ui-bundle.js").text
    version = SWAGGER_VERSION.search(bundle)
    assert version is not None, "no version stamp in the Swagger UI bundle"
    if client.get("/openapi.json").json()["openapi"].startswith("3.1"):
        assert int(version.group(1)) >= 5, "Swagger UI before 5 cannot render an OpenAPI 3.1 description"
