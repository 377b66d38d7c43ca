"""Process settings, read once from SWITCHBOARD_* environment variables."""

from __future__ import annotations

import secrets
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of the service; built once per process."""

    model_config = SettingsConfigDict(env_prefix="SWITCHBOARD_", extra="ignore")

    home: Path = Path(".switchboard")
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    public_url: str | None = None
    database_url: str | None = None
    temporal_address: str | None = None
    temporal_namespace: str = "default"
    temporal_port: int = 7233
    temporal_ui_port: int = 8233
    task_queue: str = "switchboard"
    admin_token: str | None = None
    secret_key: str | None = Field(default=None, description="hex AES-256 key for secrets at rest")
    ingest_body_max: int = 1024 * 1024
    agent_body_max: int = 1024 * 1024
    ingest_wait_seconds: float = 10.0
    ingest_rate_per_second: float = 10.0
    ingest_rate_burst: int = 20
    agent_rate_per_second: float = 20.0
    agent_rate_burst: int = 40
    webhook_admin_rate_per_second: float = 1.0
    webhook_admin_rate_burst: int = 5
    db_pool_max: int = 10
    api_worker: bool = True
    eager_start: bool = True
    evaluate_locally: bool = False
    # Concurrent rule evaluations per worker process: its sandbox children and its evaluate-queue activity slots.
    sandbox_slots: int = Field(default=2, ge=1, le=64)
    # How long a delivery's evaluation may wait in Temporal for a worker before it faults as sandbox_busy.
    evaluate_queue_seconds: float = Field(default=120.0, gt=0, le=3600)
    # The API process's own sandbox for test_webhook_rules and backtest_webhook_rules (never a delivery's).
    rule_test_slots: int = Field(default=1, ge=1, le=16)
    log_level: str = "INFO"

    def base_url(self) -> str:
        """Base URL used to build ingest URLs."""
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "localhost" if self.http_host in ("0.0.0.0", "127.0.0.1") else self.http_host
        return f"http://{host}:{self.http_port}"

    def ensure_generated_secrets(self) -> None:
        """Fill admin token and secret key from the data folder, generating them on first use."""
        self.home.mkdir(parents=True, exist_ok=True)
        if not self.admin_token:
            self.admin_token = _read_or_create(self.home / "admin_token", lambda: "sba_" + secrets.token_hex(24))
        if not self.secret_key:
            self.secret_key = _read_or_create(self.home / "secret_key", lambda: secrets.token_hex(32))


def _read_or_create(path: Path, make: object) -> str:
    if path.exists():
        return path.read_text().strip()
    assert callable(make)
    value = str(make())
    path.write_text(value + "\n")
    path.chmod(0o600)
    return value
