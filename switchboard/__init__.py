"""Shared infrastructure of every role: settings, logs, metrics, tracing, the Temporal connection, background tasks."""
