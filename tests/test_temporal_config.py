"""The production dynamic config file and the dev server's flags carry the same Temporal settings."""

from __future__ import annotations

import re
from pathlib import Path

from cli.embedded import TEMPORAL_DYNAMIC_CONFIG, dev_server_args

ROOT = Path(__file__).resolve().parent.parent


def test_deploy_dynamic_config_matches_the_dev_server_flags() -> None:
    text = (ROOT / "deploy" / "temporal" / "dynamicconfig.yaml").read_text()
    # The file is plain `key:` / `  - value: v` pairs (no YAML parser among the dependencies).
    pairs = dict(re.findall(r"^([\w.]+):\n  - value: (\S+)$", text, flags=re.MULTILINE))
    assert pairs == TEMPORAL_DYNAMIC_CONFIG
    flags = dev_server_args()
    for key, value in TEMPORAL_DYNAMIC_CONFIG.items():
        assert f"{key}={value}" in flags
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "./deploy/temporal/dynamicconfig.yaml:/etc/temporal/config/dynamicconfig/switchboard.yaml" in compose
    assert "DYNAMIC_CONFIG_FILE_PATH: /etc/temporal/config/dynamicconfig/switchboard.yaml" in compose
