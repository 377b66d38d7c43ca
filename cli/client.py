"""How a client command reaches the API: its base URL, its credential, one verb call, and failures as one line.

A client command (an operator or owner command) never starts or configures anything: it reads what it was
given (`--url`, `--admin-token`, `--token`, or `SWITCHBOARD_URL`, `SWITCHBOARD_ADMIN_TOKEN`, `SWITCHBOARD_TOKEN`)
and otherwise the API's bind address and the admin token file `switchboard dev` wrote. It never generates a token
(a fresh one could only fail with 401), and it never sends the admin token to `SWITCHBOARD_PUBLIC_URL`: that is
the address producers reach (ingest URLs), possibly a public proxy, not the operator's way in.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from switchboard.settings import Settings

# Names of environment variables, not secrets.
URL_ENV = "SWITCHBOARD_URL"
ADMIN_TOKEN_ENV = "SWITCHBOARD_ADMIN_TOKEN"  # noqa: S105
TOKEN_ENV = "SWITCHBOARD_TOKEN"  # noqa: S105
LEGACY_TOKEN_ENV = "SWITCHBOARD_CREDENTIAL"  # noqa: S105
"""The owner credential's earlier variable, still read after SWITCHBOARD_TOKEN."""

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


def api_url(settings: Settings, given: str | None) -> str:
    """`--url`, else $SWITCHBOARD_URL, else the API's bind address (never SWITCHBOARD_PUBLIC_URL)."""
    url = given or os.environ.get(URL_ENV)
    if url:
        if not url.startswith(("http://", "https://")):
            raise CliError("invalid_url", f"{url!r}: the API URL starts with http:// or https://")
        return url.rstrip("/")
    host = settings.http_host
    # A wildcard bind is reached on loopback, the way an operator on the API's host reaches it.
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.http_port}"


def admin_token(settings: Settings, given: str | None) -> str:
    """`--admin-token`, else $SWITCHBOARD_ADMIN_TOKEN, else the token file in SWITCHBOARD_HOME; never a new one."""
    token = given or settings.admin_token  # Settings reads SWITCHBOARD_ADMIN_TOKEN
    if token:
        return token
    path: Path = settings.home / "admin_token"
    if path.is_file():
        found = path.read_text().strip()
        if found:
            return found
    raise CliError(
        "missing_admin_token",
        f"no admin token: pass --admin-token or set {ADMIN_TOKEN_ENV} (`switchboard dev` prints it and keeps it"
        f" in {path.resolve()}; from another folder set SWITCHBOARD_HOME to that data folder)",
    )


def owner_token(given: str | None) -> str:
    """`--token`, else $SWITCHBOARD_TOKEN (else the older $SWITCHBOARD_CREDENTIAL)."""
    token = given or os.environ.get(TOKEN_ENV) or os.environ.get(LEGACY_TOKEN_ENV)
    if token:
        return token
    raise CliError(
        "missing_token",
        f"this command acts as an endpoint: pass --token sbk_… or set {TOKEN_ENV}"
        " (`switchboard endpoint vend` prints an endpoint's credential once)",
    )


def call(base: str, path: str, token: str, body: dict[str, Any], *, timeout: float = 90.0) -> Any:
    """POST one verb and answer its JSON; every failure is a CliError naming a stable code."""
    url = f"{base}{path}"
    try:
        # No redirects are followed: a bearer token goes to the URL it was given for, nowhere else.
        resp = httpx.post(url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=timeout)
    except httpx.TimeoutException:
        raise CliError("timeout", f"{base} did not answer within {timeout:g} s") from None
    except httpx.HTTPError as exc:
        raise CliError(
            "unreachable",
            f"cannot reach {base} ({exc or type(exc).__name__}): is `switchboard dev` or `switchboard api` running"
            f" there? Point at it with --url or {URL_ENV}",
        ) from None
    try:
        answer = resp.json()
    except ValueError:
        raise CliError("bad_response", f"HTTP {resp.status_code} from {url} is not JSON", exit_code=1) from None
    if resp.status_code < 400:
        return answer
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        raise CliError("bad_response", f"HTTP {resp.status_code} from {url}", exit_code=1)
    code = str(error.get("code") or "error")
    message = str(error.get("message") or f"HTTP {resp.status_code}")
    if resp.status_code == 401 and path.startswith("/admin/"):
        message += f" (the admin token is not this API's: check --admin-token / {ADMIN_TOKEN_ENV})"
    elif resp.status_code == 401:
        message += f" (check --token / {TOKEN_ENV}: revoked, or not a credential of this API)"
    retry = resp.headers.get("Retry-After")
    if retry:
        message += f"; retry after {retry} s"
    raise CliError(code, message, exit_code=1)
