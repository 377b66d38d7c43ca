"""/docs (Swagger UI) and /redoc served with assets from this installation: nothing is loaded from outside.

The assets come from the `fastapi-standalone-docs` wheel (swagger-ui-dist and the Redoc standalone bundle, with
their licences, and Redoc's logo patched to a local file). Only its files are used: the pages are FastAPI's own
`get_swagger_ui_html` / `get_redoc_html` with local asset URLs, as FastAPI documents for self-hosted assets.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_standalone_docs
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = Path(fastapi_standalone_docs.__file__).resolve().parent / "static"
DOCS_URL = "/docs"
REDOC_URL = "/redoc"
# swagger-ui's online validator badge fetches an image from validator.swagger.io: off, nothing leaves.
SWAGGER_PARAMETERS = {"validatorUrl": None}


def install_docs(app: FastAPI) -> None:
    """Mount the two documentation pages and their assets on an app created with docs_url=redoc_url=None."""
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{DOCS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_URL}/fastapi/favicon.png",
            swagger_ui_parameters=SWAGGER_PARAMETERS,
        )

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{REDOC_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_URL}/fastapi/favicon.png",
            with_google_fonts=False,
        )

    # The pages are routes, matched before these mounts; the bundle's patched logo is read from <page>/logo-mini.svg.
    app.mount(f"{DOCS_URL}/fastapi", StaticFiles(directory=ASSETS / "fastapi"), name="docs-fastapi")
    app.mount(DOCS_URL, StaticFiles(directory=ASSETS / "swagger"), name="docs-swagger")
    app.mount(REDOC_URL, StaticFiles(directory=ASSETS / "redoc"), name="docs-redoc")
