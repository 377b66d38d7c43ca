"""The codec endpoint (Temporal's codec server protocol), so the Temporal UI and CLI can read sealed payloads.

``POST /codec/decode`` and ``/codec/encode`` take and answer ``{"payloads": [...]}`` (the protobuf JSON of
``temporal.api.common.v1.Payloads``). Decoding reveals what the payload key protects, so every call needs the
admin token: as ``Authorization: Bearer`` (the Temporal CLI's ``--codec-auth``), or as the session cookie that
``/codec/login`` sets for a browser (the UI's codec setting "include cross-origin credentials"). Browsers are
answered only from SWITCHBOARD_CODEC_ORIGINS (default: the local Temporal UI); any other Origin is refused.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from temporalio.api.common.v1 import Payloads

from api.errors import error_response
from switchboard.payload_codec import PayloadKeyError, payload_codec
from switchboard.settings import Settings

# A sealed 1 MB body is about 1.4 MB of base64 in a request; a page of the UI asks for many payloads at once.
CODEC_BODY_MAX = 16 * 1024 * 1024
COOKIE = "switchboard_codec"
_ALLOW_HEADERS = "authorization, content-type, x-namespace"
_LOGIN_PAGE = """<!doctype html><meta charset="utf-8"><title>Switchboard codec login</title>
<form method="post" action="/codec/login"><label>Admin token <input type="password" name="admin_token"
autocomplete="off" autofocus></label> <button>Sign in</button></form>
<p>Sets a cookie for this host's <code>/codec</code> endpoint, so the Temporal UI can decode payloads.</p>"""


def session_value(admin_token: str) -> str:
    """The browser session cookie's value: derived from the admin token, so a new token ends every session."""
    return hmac.new(admin_token.encode(), b"switchboard codec session", hashlib.sha256).hexdigest()


def _error(code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return error_response(code, message, headers)


def codec_router(settings: Settings) -> APIRouter:
    """The /codec routes for these settings (404 on every route when no payload key is set)."""
    router = APIRouter(prefix="/codec", tags=["codec"], include_in_schema=bool(settings.payload_key))
    codec = payload_codec(settings.payload_key, settings.payload_old_keys)
    origins = settings.codec_allowed_origins()

    def cors(request: Request) -> dict[str, str] | None:
        """CORS headers for an allowed Origin, {} without one (not a browser), None for any other."""
        origin = request.headers.get("origin")
        if origin is None:
            return {}
        if origin.rstrip("/") not in origins:
            return None
        return {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Credentials": "true",
            "Access-Control-Allow-Methods": "POST, OPTIONS",
            "Access-Control-Allow-Headers": _ALLOW_HEADERS,
            "Access-Control-Max-Age": "600",
            "Vary": "Origin",
        }

    def authenticated(request: Request) -> bool:
        expected = settings.admin_token or ""
        if not expected:
            return False
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if token and hmac.compare_digest(token.encode(), expected.encode()):
            return True
        cookie = request.cookies.get(COOKIE, "")
        return bool(cookie) and hmac.compare_digest(cookie.encode(), session_value(expected).encode())

    async def convert(request: Request, decode: bool) -> Response:
        headers = cors(request)
        if headers is None:
            return _error("forbidden", "origin not allowed for the codec endpoint")
        if codec is None:
            return _error("not_found", "no payload codec: SWITCHBOARD_PAYLOAD_KEY is not set", headers)
        if not authenticated(request):
            return _error("unauthenticated", "admin token required", headers)
        body = await request.body()
        if len(body) > CODEC_BODY_MAX:
            return _error("too_large", "request body too large", headers)
        try:
            payloads = json_format.Parse(body, Payloads())
        except (json_format.ParseError, DecodeError, UnicodeDecodeError) as exc:
            return _error("invalid_argument", f'expected {{"payloads": [...]}}: {exc}'[:300], headers)
        try:
            done = await (codec.decode if decode else codec.encode)(payloads.payloads)
        except PayloadKeyError as exc:
            return _error("invalid_argument", str(exc), headers)
        answer = json_format.MessageToDict(Payloads(payloads=done))
        return JSONResponse({"payloads": answer.get("payloads", [])}, headers=headers)

    @router.post("/decode", summary="Open sealed Temporal payloads (codec server protocol; admin).")
    async def decode(request: Request) -> Response:
        return await convert(request, decode=True)

    @router.post("/encode", summary="Seal Temporal payloads under the current payload key (admin).")
    async def encode(request: Request) -> Response:
        return await convert(request, decode=False)

    @router.options("/decode", include_in_schema=False)
    @router.options("/encode", include_in_schema=False)
    async def preflight(request: Request) -> Response:
        headers = cors(request)
        if not headers:
            return _error("forbidden", "origin not allowed for the codec endpoint")
        return Response(status_code=204, headers=headers)

    @router.get("/login", include_in_schema=False)
    async def login_page() -> Response:
        if codec is None:
            return _error("not_found", "no payload codec: SWITCHBOARD_PAYLOAD_KEY is not set")
        return HTMLResponse(_LOGIN_PAGE)

    @router.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        if codec is None:
            return _error("not_found", "no payload codec: SWITCHBOARD_PAYLOAD_KEY is not set")
        expected = settings.admin_token or ""
        form = parse_qs((await request.body())[:4096].decode("utf-8", "replace"))
        token = (form.get("admin_token") or [""])[0].strip()
        if not expected or not token or not hmac.compare_digest(token.encode(), expected.encode()):
            return _error("unauthenticated", "admin token required")
        page = HTMLResponse("<!doctype html><p>Signed in: the Temporal UI can now decode payloads.</p>")
        # Strict and HttpOnly: sent only on same-site requests (the UI on another port of this host is same-site),
        # never readable by scripts; scoped to /codec.
        secure = request.url.scheme == "https"
        page.set_cookie(COOKIE, session_value(expected), httponly=True, samesite="strict", path="/codec", secure=secure)
        return page

    return router
