"""Switchboard: webhook deliveries become durable, explainable work for AI agents."""
