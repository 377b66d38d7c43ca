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
    # Total time a producer waits for the routed answer; a per-source cap (routing.models.INGEST_WAIT_CAP_SECONDS)
    # keeps short-windowed producers (Slack: 3 s) inside their window. Past it the answer is `202 pending`.
    ingest_wait_seconds: float = 5.0
    # How long Temporal gets to take a start before the delivery goes to the PostgreSQL inbox instead.
    temporal_start_timeout_seconds: float = 2.0
    # Admission: starts+waits in flight per API process beyond which deliveries go to the inbox at once.
    ingest_max_inflight: int = 64
    # After Temporal refused or missed a start, deliveries go straight to the inbox for this long.
    ingest_start_backoff_seconds: float = 2.0
    # Operator default per-webhook rate (deliveries/s; 0 = unpaced) and its burst; a webhook may override it.
    webhook_rate_per_second: float = 0.0
    webhook_rate_burst: int = 10
    # The inbox relay in every worker process.
    relay_batch: int = 50
    relay_concurrency: int = 16
    relay_poll_seconds: float = 0.5
    relay_backoff_max_seconds: float = 10.0
    relay_log_seconds: float = 30.0
    ingest_rate_per_second: float = 10.0
    ingest_rate_burst: int = 20
    agent_rate_per_second: float = 20.0
    agent_rate_burst: int = 40
    webhook_admin_rate_per_second: float = 1.0
    webhook_admin_rate_burst: int = 5
    db_pool_max: int = 10
    # How long a request waits for a working database connection before answering 503.
    db_pool_timeout: float = 1.5
    # Each /healthz dependency check is cut off after this long.
    health_timeout_seconds: float = 0.8
    api_worker: bool = True
    eager_start: bool = True
    evaluate_locally: bool = False
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
