"""How a client command reaches the API: its base URL, its credential, one verb call, and failures as one line.

A client command (an operator or owner command) never starts or configures anything: it reads what it was
given (`--url`, `--admin-token`, `--token`, or `SWITCHBOARD_URL`, `SWITCHBOARD_ADMIN_TOKEN`, `SWITCHBOARD_TOKEN`)
and otherwise the API's bind address and the admin token file `switchboard dev` wrote. It never generates a token
(a fresh one could only fail with 401), and it never sends the admin token to `SWITCHBOARD_PUBLIC_URL`: that is
the address producers reach (ingest URLs), possibly a public proxy, not the operator's way in.

Only the standard library: a client command starts in a fraction of the service's import time. It reads the few
settings it needs (bind address, data folder, admin token) from the environment itself, with the defaults of
`switchboard.settings.Settings` (tests/test_cli.py holds the two equal).
"""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# Names of environment variables, not secrets.
URL_ENV = "SWITCHBOARD_URL"
ADMIN_TOKEN_ENV = "SWITCHBOARD_ADMIN_TOKEN"  # noqa: S105
TOKEN_ENV = "SWITCHBOARD_TOKEN"  # noqa: S105
HOST_ENV = "SWITCHBOARD_HTTP_HOST"
PORT_ENV = "SWITCHBOARD_HTTP_PORT"
HOME_ENV = "SWITCHBOARD_HOME"

DEFAULT_HTTP_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8000
DEFAULT_HOME = ".switchboard"
"""Settings' defaults of http_host, http_port and home, which the API and `switchboard dev` use."""

USAGE_EXIT = 2
"""Exit status of a command that could not ask (missing setting, unreachable API); 1 is the API's refusal."""


class CliError(Exception):
    """A client command's failure: a stable code and one line for a person, and the exit status."""

    def __init__(self, code: str, message: str, *, exit_code: int = USAGE_EXIT) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.exit_code = exit_code

    def line(self) -> str:
        """The one line printed on standard error."""
        return f"switchboard: {self.code}: {self.message}"


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def api_url(given: str | None, env: Mapping[str, str] | None = None) -> str:
    """`--url`, else $SWITCHBOARD_URL, else the API's bind address (never SWITCHBOARD_PUBLIC_URL)."""
    env = _env(env)
    url = given or env.get(URL_ENV)
    if url:
        if not url.startswith(("http://", "https://")):
            raise CliError("invalid_url", f"{url!r}: the API URL starts with http:// or https://")
        return url.rstrip("/")
    host = env.get(HOST_ENV, DEFAULT_HTTP_HOST)
    port = env.get(PORT_ENV, str(DEFAULT_HTTP_PORT)).strip()
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise CliError("invalid_setting", f"{PORT_ENV}: {port!r} is not a port number")
    # A wildcard bind is reached on loopback, the way an operator on the API's host reaches it.
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{int(port)}"


def admin_token(given: str | None, env: Mapping[str, str] | None = None) -> str:
    """`--admin-token`, else $SWITCHBOARD_ADMIN_TOKEN, else the token file in SWITCHBOARD_HOME; never a new one."""
    env = _env(env)
    token = given or env.get(ADMIN_TOKEN_ENV)
    if token:
        return token
    path = Path(env.get(HOME_ENV) or DEFAULT_HOME) / "admin_token"
    if path.is_file():
        found = path.read_text().strip()
        if found:
            return found
    raise CliError(
        "missing_admin_token",
        f"no admin token: pass --admin-token or set {ADMIN_TOKEN_ENV} (`switchboard dev` prints it and keeps it"
        f" in {path.resolve()}; from another folder set SWITCHBOARD_HOME to that data folder)",
    )


def owner_token(given: str | None, env: Mapping[str, str] | None = None) -> str:
    """`--token`, else $SWITCHBOARD_TOKEN."""
    env = _env(env)
    token = given or env.get(TOKEN_ENV)
    if token:
        return token
    raise CliError(
        "missing_token",
        f"this command acts as an endpoint: pass --token sbk_… or set {TOKEN_ENV}"
        " (`switchboard endpoint vend` prints an endpoint's credential once)",
    )


@dataclass(frozen=True)
class Response:
    """One HTTP answer: status, headers (names lower-cased) and body."""

    status: int
    reason: str
    headers: dict[str, str]
    body: bytes


API_HINT = f"is `switchboard dev` or `switchboard api` running there? Point at it with --url or {URL_ENV}"


def post(url: str, body: bytes, headers: Mapping[str, str], *, timeout: float, hint: str = API_HINT) -> Response:
    """POST body to url and read the whole answer; redirects are never followed (a token goes where it was sent).

    Raises CliError `timeout` or `unreachable` (naming the URL's origin, then `hint`) when no answer comes.
    """
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError("invalid_url", f"{url!r}: expected an http:// or https:// URL")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("POST", target, body=body, headers={"Content-Length": str(len(body)), **headers})
        answer = conn.getresponse()
        data = answer.read()
    except TimeoutError:
        raise CliError("timeout", f"{origin} did not answer within {timeout:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        raise CliError("unreachable", f"cannot reach {origin} ({exc or type(exc).__name__}): {hint}") from None
    finally:
        conn.close()
    return Response(answer.status, answer.reason, {k.lower(): v for k, v in answer.getheaders()}, data)


def call(base: str, path: str, token: str, body: dict[str, Any], *, timeout: float = 90.0) -> Any:
    """POST one verb and answer its JSON; every failure is a CliError naming a stable code."""
    url = f"{base}{path}"
    resp = post(
        url,
        json.dumps(body).encode(),
        {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Accept": "application/json"},
        timeout=timeout,
    )
    try:
        answer = json.loads(resp.body)
    except ValueError:
        raise CliError("bad_response", f"HTTP {resp.status} from {url} is not JSON", exit_code=1) from None
    if resp.status < 400:
        return answer
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        raise CliError("bad_response", f"HTTP {resp.status} from {url}", exit_code=1)
    code = str(error.get("code") or "error")
    message = str(error.get("message") or f"HTTP {resp.status}")
    if resp.status == 401 and path.startswith("/admin/"):
        message += f" (the admin token is not this API's: check --admin-token / {ADMIN_TOKEN_ENV})"
    elif resp.status == 401:
        message += f" (check --token / {TOKEN_ENV}: revoked, or not a credential of this API)"
    retry = resp.headers.get("retry-after")
    if retry:
        message += f"; retry after {retry} s"
    raise CliError(code, message, exit_code=1)
