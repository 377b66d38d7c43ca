"""/docs and /redoc work offline: every asset comes from this app, nothing from another origin."""

from __future__ import annotations

import re

import pytest

from tests.conftest import Stack

ATTRIBUTE_URL = re.compile(r"""(?:src|href|spec-url)\s*=\s*["']([^"']+)["']""")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_docs_pages_reference_no_external_url_and_their_assets_load(stack: Stack, page: str) -> None:
    resp = await stack.http.get(page)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    html = resp.text
    assert "http://" not in html and "https://" not in html and "//" not in re.sub(r"<!--.*?-->", "", html)
    urls = ATTRIBUTE_URL.findall(html) + re.findall(r"url: '([^']+)'", html)
    assert urls, html
    for url in urls:
        assert url.startswith("/"), url
        asset = await stack.http.get(url)
        assert asset.status_code == 200, url
        assert asset.content, url
    # The browser is told the same: scripts, styles and images from this origin only.
    csp = resp.headers["content-security-policy"]
    assert "https:" not in csp and "http:" not in csp
    assert "script-src 'self'" in csp and "default-src 'none'" in csp


async def test_docs_assets_are_the_bundles_with_no_cdn_reference(stack: Stack) -> None:
    swagger = await stack.http.get("/docs/swagger-ui-bundle.js")
    assert swagger.status_code == 200 and "SwaggerUIBundle" in swagger.text
    redoc = await stack.http.get("/redoc/redoc.standalone.js")
    assert redoc.status_code == 200 and "cdn.redoc.ly" not in redoc.text
    # Redoc's bundle reads its logo from <page>/logo-mini.svg.
    assert 'window.location.pathname+"/logo-mini.svg"' in redoc.text
    assert (await stack.http.get("/redoc/logo-mini.svg")).status_code == 200
    assert (await stack.http.get("/docs/swagger-ui.css")).headers["content-type"].startswith("text/css")
    # The online validator badge (an image from validator.swagger.io) is off.
    assert '"validatorUrl": null' in (await stack.http.get("/docs")).text
