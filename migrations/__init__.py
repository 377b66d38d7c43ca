"""The numbered SQL migrations, shipped as package data (read through switchboard/resources.py)."""
