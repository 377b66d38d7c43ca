"""The secret key check: the first process records its key's fingerprint; a process with another key refuses."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from runtime.root import api_resources, worker_resources
from store.crypto import SecretBox, SecretKeyMismatch, check_secret_key
from store.db import open_pool
from switchboard.settings import Settings


async def test_the_first_key_is_recorded_and_another_is_refused(database_url: str) -> None:
    first, second = SecretBox(secrets.token_hex(32)), SecretBox(secrets.token_hex(32))
    pool = await open_pool(database_url, max_size=2)
    try:
        await check_secret_key(pool, first)
        await check_secret_key(pool, first)  # every later start with the same key passes
        with pytest.raises(SecretKeyMismatch) as refused:
            await check_secret_key(pool, second)
    finally:
        await pool.close()
    assert refused.value.code == "secret_key_mismatch"
    assert first.key_id in refused.value.message and second.key_id in refused.value.message
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT key_id FROM secret_key_check").fetchall()
    assert rows == [(first.key_id,)]  # the fingerprint only, never the key


async def test_the_api_and_worker_roles_refuse_to_start_on_another_key(database_url: str, tmp_path: Path) -> None:
    def settings(key: str) -> Settings:
        return Settings(home=tmp_path, database_url=database_url, secret_key=key, admin_token="sba_x")

    key = secrets.token_hex(32)
    async with api_resources(settings(key)):
        pass
    other = settings(secrets.token_hex(32))
    with pytest.raises(SecretKeyMismatch):
        async with api_resources(other):
            pass
    with pytest.raises(SecretKeyMismatch):
        async with worker_resources(other):
            pass


@pytest.mark.parametrize("command", ["worker", "api"])
async def test_a_process_with_a_changed_key_exits_saying_so(database_url: str, tmp_path: Path, command: str) -> None:
    pool = await open_pool(database_url, max_size=1)
    try:
        await check_secret_key(pool, SecretBox(secrets.token_hex(32)))
    finally:
        await pool.close()
    env = {
        "PATH": str(Path(sys.executable).parent),
        "SWITCHBOARD_HOME": str(tmp_path),
        "SWITCHBOARD_DATABASE_URL": database_url,
        # Never reached: the key is checked before Temporal is.
        "SWITCHBOARD_TEMPORAL_ADDRESS": "127.0.0.1:9",
        "SWITCHBOARD_SECRET_KEY": secrets.token_hex(32),
        "SWITCHBOARD_ADMIN_TOKEN": "sba_x",
        "SWITCHBOARD_HTTP_PORT": "9",
    }
    done = subprocess.run(
        [str(Path(sys.executable).parent / "switchboard"), command],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("switchboard: secret_key_mismatch: SWITCHBOARD_SECRET_KEY (fingerprint "), done.stderr
    assert "Traceback" not in done.stderr
    assert env["SWITCHBOARD_SECRET_KEY"] not in done.stderr
