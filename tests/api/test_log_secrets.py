"""No secret reaches a log line: a served stack is driven through forced errors and every record is grepped."""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Any

import httpx
import pytest
from psycopg.types.json import Jsonb

from switchboard.logs import JsonFormatter, mask_secrets
from tests.conftest import Stack
from tests.helpers import issue_payload, token_of
from tests.signing import sign_github


def test_mask_secrets_masks_paths_credentials_and_bearer_tokens() -> None:
    line = (
        "POST http://h/webhooks/w/0123456789abcdef0123456789abcdef?x=1 sbk_"
        + "a" * 64
        + " whsec_"
        + "b" * 64
        + " Authorization: Bearer sba_xyz"
    )
    masked = mask_secrets(line)
    assert "0123456789abcdef" not in masked and "aaaa" not in masked and "bbbb" not in masked
    assert "sba_xyz" not in masked
    assert "/webhooks/w/«token»?x=1" in masked
    github = "token ghp_" + "c" * 36 + " and github_pat_11AB" + "d" * 20 + "_" + "e" * 40
    assert mask_secrets(github) == "token ghp_«redacted» and github_pat_«redacted»"


def _everything(caplog: pytest.LogCaptureFixture) -> str:
    """Every captured record as the pytest formatter and as the production JSON formatter print it."""
    json_formatter = JsonFormatter()
    lines = [caplog.text]
    for record in caplog.records:
        lines.append(json_formatter.format(record))
        lines.append(repr(vars(record)))
    return "\n".join(lines)


async def test_no_secret_or_token_is_logged_under_forced_errors(
    live_stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    stack = live_stack
    caplog.set_level(logging.DEBUG)
    for name in ("uvicorn", "uvicorn.access", "uvicorn.error", "switchboard", "httpx", "httpcore"):
        caplog.set_level(logging.DEBUG, logger=name)

    agent = await stack.agent(queues=["work"])
    secrets: list[str] = [agent.credential, str(stack.settings.admin_token), str(stack.settings.secret_key)]
    auth = {"Authorization": f"Bearer {agent.credential}"}
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30) as http:

        async def verb(name: str, body: dict[str, Any]) -> httpx.Response:
            return await http.post(f"/v1/{name}", json=body, headers=auth)

        github = (await verb("create_webhook", {"source_type": "github", "target_queue": "work"})).json()
        generic = (await verb("create_webhook", {"source_type": "generic", "target_queue": "work"})).json()
        collector = (await verb("create_webhook", {"source_type": "generic", "target_queue": "work"})).json()
        hmac_secret = (
            await verb(
                "configure_webhook",
                {"webhook_id": collector["webhook_id"], "collector": {"hmac": {"header": "X-Signature"}}},
            )
        ).json()["hmac_secret"]
        broken = (await verb("create_webhook", {"source_type": "generic", "target_queue": "work"})).json()
        rotated = (await verb("rotate_webhook", {"webhook_id": github["webhook_id"], "new_ingest_token": True})).json()
        secrets += [github["secret"], rotated["secret"], hmac_secret]
        tokens = [token_of(w["ingest_url"]) for w in (github, generic, collector, broken, rotated)]
        secrets += tokens
        gh = {**github, **rotated}

        body = b'{"title": "ok"}'
        # A delivery that routes, a redelivery, a bad signature, an unsigned one, a bad collector HMAC.
        good = f"/webhooks/w/{token_of(generic['ingest_url'])}"
        assert (await http.post(good, content=body, headers={"X-Delivery-Id": "d1"})).status_code == 202
        assert (await http.post(good, content=body, headers={"X-Delivery-Id": "d1"})).status_code == 202
        payload = issue_payload()
        raw = httpx.Request("POST", "/", json=payload).content
        bad_sig = {"X-GitHub-Event": "issues", **sign_github(b"whsec_" + b"0" * 64, raw)}
        gh_url = f"/webhooks/w/{token_of(gh['ingest_url'])}"
        assert (await http.post(gh_url, content=raw, headers=bad_sig)).status_code == 401
        assert (await http.post(gh_url, content=raw)).status_code == 401
        signed = {"X-GitHub-Event": "issues", **sign_github(gh["secret"].encode(), raw)}
        assert (await http.post(gh_url, content=raw, headers=signed)).status_code == 202
        col_url = f"/webhooks/w/{token_of(collector['ingest_url'])}"
        assert (
            await http.post(col_url, content=body, headers={"X-Signature": "sha256=" + "0" * 64})
        ).status_code == 401
        good_mac = "sha256=" + hmac.new(hmac_secret.encode(), body, hashlib.sha256).hexdigest()
        assert (await http.post(col_url, content=body, headers={"X-Signature": good_mac})).status_code == 202
        # The old ingest token of the rotated webhook, and an unknown one.
        assert (await http.post(f"/webhooks/w/{token_of(github['ingest_url'])}", content=raw)).status_code == 404
        assert (await http.post("/webhooks/w/" + "f" * 32, content=body)).status_code == 404
        # An unexpected exception while handling an ingest path: a stored row the receiver cannot load.
        stack.sql("UPDATE endpoint_webhooks SET config = %s WHERE id = %s", Jsonb([1]), broken["webhook_id"])
        crashed = await http.post(f"/webhooks/w/{token_of(broken['ingest_url'])}", content=body)
        assert crashed.status_code == 500, crashed.text
        # Verb errors: not found, invalid argument, an unknown credential, an admin call with a bad token.
        assert (await verb("get_todo", {"todo_id": "td_nope"})).status_code == 404
        assert (await verb("create_webhook", {"source_type": "generic", "target_queue": 5})).status_code == 422
        wrong = await http.post("/v1/whoami", json={}, headers={"Authorization": "Bearer sbk_" + "0" * 64})
        assert wrong.status_code == 401
        bad_admin = await http.post(
            "/admin/v1/create_human", json={"name": "x"}, headers={"Authorization": "Bearer not-the-admin-token"}
        )
        assert bad_admin.status_code == 401

    text = _everything(caplog)
    assert "/webhooks/w/«token»" in text  # the ingest paths were logged, masked
    assert "delivery rejected" in text and "unexpected error" in text
    for secret in secrets:
        assert secret and secret not in text, f"a secret reached the logs: {secret[:6]}…"
