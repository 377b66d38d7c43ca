"""deploy/ and docker-compose.yml agree with the code: current Temporal images, a private UI, retention at least the
event retention, and alert rules and the dashboard that name only series the processes export."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

import api.app  # noqa: F401 - imports every module that defines a metric
from activities.models import UpkeepInput
from switchboard.metrics_database import DatabaseGauges, DatabaseSnapshot

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = (ROOT / "docker-compose.yml").read_text()
ALERTS = (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text()
SCRAPE = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
DASHBOARD = json.loads((ROOT / "deploy" / "grafana" / "switchboard.json").read_text())


def test_compose_runs_current_temporal_images_with_a_schema_job() -> None:
    assert "auto-setup" not in COMPOSE  # upstream no longer builds it
    [server] = re.findall(r"image: temporalio/server:(\S+)", COMPOSE)
    tools = set(re.findall(r"image: temporalio/admin-tools:(\S+)", COMPOSE))
    assert tools == {server}, "admin-tools carries the schema files of its own server version"
    assert 'entrypoint: ["bash", "/switchboard-deploy/setup-schema.sh"]' in COMPOSE
    assert 'entrypoint: ["bash", "/switchboard-deploy/setup-namespace.sh"]' in COMPOSE
    for script in ("setup-schema.sh", "setup-namespace.sh", "register-search-attributes.sh"):
        assert (ROOT / "deploy" / "temporal" / script).exists()
    assert (
        "temporal_visibility OWNER temporal"
        in (ROOT / "deploy" / "postgres" / "initdb.d" / "10-switchboard.sh").read_text()
    )


def published(section: str) -> list[str]:
    """The host bindings under a service's `ports:` key (not `expose:`, which publishes nothing)."""
    found: list[str] = []
    for block in re.findall(r"\n    ports:\n((?:      (?:- .*|#.*)\n)+)", section):
        found += re.findall(r'- "([^"]+)"', block)
    return found


def test_the_temporal_ui_is_published_on_loopback_only() -> None:
    ui = COMPOSE[COMPOSE.index("  temporal-ui:") : COMPOSE.index("  # One-shot: applies migrations/")]
    assert published(ui) == ["127.0.0.1:8233:8080"]
    # Nothing of Temporal is published beyond the host's loopback.
    temporal = COMPOSE[COMPOSE.index("  temporal-schema:") : COMPOSE.index("  # One-shot: applies migrations/")]
    ports = published(temporal)
    assert ports and all(p.startswith("127.0.0.1:") for p in ports), ports


def test_history_retention_is_at_least_the_event_retention() -> None:
    [hours] = re.findall(r"TEMPORAL_RETENTION: \$\{SWITCHBOARD_TEMPORAL_RETENTION:-(\d+)h\}", COMPOSE)
    assert int(hours) >= 24 * UpkeepInput().retention_days


def test_worker_metrics_port_is_the_one_prometheus_scrapes() -> None:
    [port] = re.findall(r'SWITCHBOARD_WORKER_METRICS_PORT: "(\d+)"', COMPOSE)
    worker_job = SCRAPE[SCRAPE.index("job_name: switchboard-worker") :]
    assert f"port: {port}" in worker_job.split("job_name:")[1]


def service(name: str) -> str:
    """One service's block of docker-compose.yml (up to the next service or comment at its indentation)."""
    start = COMPOSE.index(f"\n  {name}:\n") + 1
    end = re.search(r"\n(?:  )?\S", COMPOSE[start + 1 :])
    return COMPOSE[start : start + 1 + end.start()] if end else COMPOSE[start:]


def test_the_temporal_sdk_metrics_port_is_the_one_prometheus_scrapes_on_api_and_worker() -> None:
    [port] = re.findall(r'SWITCHBOARD_TEMPORAL_METRICS_PORT: "(\d+)"', COMPOSE)
    job = SCRAPE[SCRAPE.index("job_name: switchboard-temporal-sdk") :].split("job_name:")[1]
    assert 'names: ["api", "worker"]' in job and f"port: {port}" in job
    for name in ("api", "worker"):
        assert re.search(rf'\n    expose:\n(?:      - "\d+"\n)*      - "{port}"\n', service(name)), name


def exported_families() -> set[str]:
    names = {metric.name for metric in REGISTRY.collect()}
    snapshot = DatabaseSnapshot(0, 0, 0, 0.0, 0.0, {("q", "pending"): 1})

    async def fetch() -> DatabaseSnapshot:
        return snapshot

    gauges = DatabaseGauges(fetch)
    gauges._snapshot = snapshot
    return names | {metric.name for metric in gauges.collect()}


def referenced(text: str) -> set[str]:
    found = set()
    for name in re.findall(r"\bswitchboard_[a-z_]+", text):
        for suffix in ("_total", "_bucket", "_count", "_sum"):
            name = name.removesuffix(suffix)
        found.add(name)
    return found


def test_alert_rules_and_dashboard_name_only_exported_series() -> None:
    exported = exported_families()
    exprs = " ".join(t["expr"] for p in DASHBOARD["panels"] for t in p.get("targets", []))
    assert referenced(ALERTS) - exported == set()
    assert referenced(exprs) - exported == set()
    # The alerts the docs promise.
    for alert in (
        "SwitchboardDeadLetters",
        "SwitchboardSignatureFailures",
        "SwitchboardRuleFaults",
        "SwitchboardInboxDepth",
        "SwitchboardSandboxKills",
    ):
        assert f"alert: {alert}" in ALERTS
    assert "switchboard_todos" in exprs and "temporal_workflow_completed_total" in exprs
