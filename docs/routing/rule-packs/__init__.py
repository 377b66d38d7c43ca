"""The shipped rule packs as the `rule_packs` data package (pyproject.toml maps this folder; read through
switchboard/resources.py), so a plain install carries them; SPEC-0020 names this folder as their home."""
