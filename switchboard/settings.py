"""Process settings, read once from SWITCHBOARD_* environment variables."""

from __future__ import annotations

import ipaddress
import secrets
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from switchboard.payload_codec import payload_codec

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(value: str) -> tuple[Network, ...]:
    """Comma-separated IPs and CIDRs; anything else raises ValueError (a broken setting refuses to start)."""
    networks: list[Network] = []
    for item in value.split(","):
        item = item.strip()
        if item:
            networks.append(ipaddress.ip_network(item, strict=False))
    return tuple(networks)


def normal_api_url(value: str) -> str:
    """An http(s) API base URL with a host, no credentials, query or fragment, in one spelling (scheme and host
    lower-cased, no trailing slash); ValueError otherwise."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http:// or https:// URL with a host")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError(f"{value!r} must not carry credentials, a query or a fragment")
    netloc = parts.hostname.lower() + (f":{parts.port}" if parts.port is not None else "")
    return f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}"


def parse_api_urls(value: str) -> list[str]:
    """Comma-separated API base URLs, each normalized (normal_api_url)."""
    return [normal_api_url(item) for item in value.split(",") if item.strip()]


class Settings(BaseSettings):
    """Every knob of the service; built once per process."""

    model_config = SettingsConfigDict(env_prefix="SWITCHBOARD_", extra="ignore")

    home: Path = Path(".switchboard")
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    # Client bounds of every API process (api/connections.py): a request's line and headers must arrive within
    # the head timeout of the connection opening (or of the request's first byte), its body within the body
    # timeout of its headers; open connections are capped per client address and in all (the latter also by the
    # process's descriptor limit). Connections from SWITCHBOARD_FORWARDED_ALLOW_IPS count only in all.
    http_head_timeout_seconds: float = Field(default=10.0, gt=0, le=3600)
    http_body_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    http_max_connections: int = Field(default=4096, ge=2)
    http_max_connections_per_address: int = Field(default=256, ge=1)
    public_url: str | None = None
    database_url: str | None = None
    temporal_address: str | None = None
    temporal_namespace: str = "default"
    temporal_port: int = 7233
    temporal_ui_port: int = 8233
    # Temporal TLS / mTLS and API key (switchboard/temporal.py connect_security). Files are PEM; an API key or
    # any TLS file turns TLS on; `temporal_tls` alone means TLS with the system roots.
    temporal_tls: bool = False
    temporal_tls_ca_file: Path | None = None
    temporal_tls_cert_file: Path | None = None
    temporal_tls_key_file: Path | None = None
    temporal_tls_server_name: str | None = None
    temporal_api_key: str | None = None
    task_queue: str = "switchboard"
    admin_token: str | None = None
    secret_key: str | None = Field(default=None, description="hex AES-256 key for secrets at rest")
    # The optional payload codec (switchboard/payload_codec.py): Temporal payloads sealed with AES-256-GCM. Old keys only
    # open (rotation); the codec endpoint (/codec, api/codec_endpoint.py) answers browsers of these origins only.
    payload_key: str | None = None
    payload_old_keys: str = ""
    codec_origins: str = ""
    ingest_body_max: int = 1024 * 1024
    agent_body_max: int = 1024 * 1024
    # Total time a producer waits for the routed answer; a per-source cap (routing.sources, wait_cap_seconds)
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
    # Per client address, charged only by requests refused before or at verification (api/ingest.py).
    ingest_rate_per_second: float = 10.0
    ingest_rate_burst: int = 20
    # Todo and read verbs, per endpoint and API process: they bound a runaway client, they never pace a fleet.
    # A fleet at the store's own pace needs up to 2 calls per todo (claim_next {max} about 1.1). The default sits
    # above what one API process serves on a small host, so only a client far past any fleet meets it;
    # concurrency, what the store feels, is bounded apart from rate by the pool (db_pool_max statements in flight
    # per process, 503 after db_pool_timeout).
    agent_rate_per_second: float = 2000.0
    agent_rate_burst: int = 4000
    # Rule, route, collector and dry-run/backtest verbs, per endpoint: an owner saving in a row is not churn.
    authoring_rate_per_second: float = 10.0
    authoring_rate_burst: int = 30
    # create/rotate/delete webhook and schedule, per endpoint: tight, as SPEC-0006 asks.
    webhook_admin_rate_per_second: float = 1.0
    webhook_admin_rate_burst: int = 5
    # Comma-separated IPs/CIDRs of reverse proxies whose X-Forwarded-For is believed; empty trusts none.
    forwarded_allow_ips: str = ""
    db_pool_max: int = 10
    # How long a request waits for a working database connection before answering 503.
    db_pool_timeout: float = 1.5
    # PostgreSQL cancels an API statement running longer; a request's use of the database (the wait for a
    # connection, then its statements) ends within db_pool_timeout + this, also while PostgreSQL hangs (then 503).
    db_statement_timeout: float = Field(default=5.0, gt=0, le=600)
    # Each /healthz dependency check is cut off after this long.
    health_timeout_seconds: float = 0.8
    api_worker: bool = True
    eager_start: bool = True
    # Concurrent rule evaluations per worker process: its sandbox children and its evaluate-queue activity slots.
    sandbox_slots: int = Field(default=2, ge=1, le=64)
    # How long a delivery's evaluation may wait in Temporal for a worker before it faults as sandbox_busy.
    evaluate_queue_seconds: float = Field(default=120.0, gt=0, le=3600)
    # The API process's own sandbox for test_webhook_rules, backtest_webhook_rules and save-time compiles.
    rule_test_slots: int = Field(default=1, ge=1, le=16)
    # LLM triage (SPEC-0020 Phase 2) operator ceilings: triage calls per endpoint (the sum over its webhooks) per
    # minute and per UTC day, which also cap any one webhook's per_minute/per_day, and the longest call allowed.
    llm_triage_per_minute_max: int = Field(default=60, ge=0, le=100_000)
    llm_triage_per_day_max: int = Field(default=5_000, ge=0, le=10_000_000)
    llm_timeout_max_seconds: float = Field(default=30.0, gt=0, le=600)
    # Reconciliation of github webhooks against GitHub's delivery log (set_webhook_reconciler). Off: every
    # reconciler's Temporal Schedule is paused and a run that starts anyway calls nothing. The rest bound what one
    # run may do: the owners' shortest interval, pages of deliveries read, redeliveries requested, the pause between
    # two redelivery requests, each call's timeout, and the API base URLs a reconciler may call (comma-separated).
    reconcile: bool = True
    reconcile_api_urls: str = "https://api.github.com"
    reconcile_interval_min_seconds: int = Field(default=60, ge=10, le=86_400)
    reconcile_pages_max: int = Field(default=10, ge=1, le=1000)
    reconcile_redeliveries_max: int = Field(default=50, ge=0, le=10_000)
    reconcile_request_gap_seconds: float = Field(default=1.0, ge=0, le=60)
    reconcile_timeout_seconds: float = Field(default=10.0, gt=0, le=120)
    log_level: str = "INFO"
    # A worker process's metrics listener (GET any path on SWITCHBOARD_HTTP_HOST:port); 0 = none. API processes
    # serve /metrics on their HTTP port, and an API-hosted worker shares it.
    worker_metrics_port: int = Field(default=0, ge=0, le=65535)
    # The Temporal SDK's own metrics (its exporter, GET /metrics on SWITCHBOARD_HTTP_HOST:port), in every process
    # that connects to Temporal; 0 = not exported. One port per process: processes sharing a host need their own.
    temporal_metrics_port: int = Field(default=0, ge=0, le=65535)

    @field_validator(
        "temporal_tls_ca_file",
        "temporal_tls_cert_file",
        "temporal_tls_key_file",
        "temporal_tls_server_name",
        "temporal_api_key",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # Compose passes `${VAR:-}` as an empty string: that means "not set", never the current directory.
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _client_pair(self) -> Settings:
        # mTLS needs both halves; one alone would silently connect without a client certificate.
        if (self.temporal_tls_cert_file is None) != (self.temporal_tls_key_file is None):
            raise ValueError("SWITCHBOARD_TEMPORAL_TLS_CERT_FILE and _KEY_FILE must be set together")
        return self

    @model_validator(mode="after")
    def _payload_keys(self) -> Settings:
        payload_codec(self.payload_key, self.payload_old_keys)  # a malformed key refuses to start
        return self

    def codec_allowed_origins(self) -> frozenset[str]:
        """Browser origins the codec endpoint answers: SWITCHBOARD_CODEC_ORIGINS, else the local Temporal UI."""
        if self.codec_origins.strip():
            return frozenset(o.strip().rstrip("/") for o in self.codec_origins.split(",") if o.strip())
        port = self.temporal_ui_port
        return frozenset({f"http://localhost:{port}", f"http://127.0.0.1:{port}"})

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _valid_networks(cls, value: str) -> str:
        parse_networks(value)  # a malformed proxy list refuses to start rather than trusting something else
        return value

    @field_validator("reconcile_api_urls")
    @classmethod
    def _valid_api_urls(cls, value: str) -> str:
        parse_api_urls(value)  # a malformed URL refuses to start rather than allowing something else
        return value

    def reconcile_api_url_set(self) -> frozenset[str]:
        """The parsed SWITCHBOARD_RECONCILE_API_URLS: the API base URLs a reconciler may call."""
        return frozenset(parse_api_urls(self.reconcile_api_urls))

    def trusted_proxies(self) -> tuple[Network, ...]:
        """The parsed SWITCHBOARD_FORWARDED_ALLOW_IPS."""
        return parse_networks(self.forwarded_allow_ips)

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
