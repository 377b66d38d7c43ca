"""The Temporal connection: one client construction, with the pydantic data converter every process shares."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from switchboard.settings import Settings


async def connect(settings: Settings, address: str | None = None, *, lazy: bool = False) -> Client:
    """A client with the pydantic data converter, so models cross the wire as JSON."""
    target = address or settings.temporal_address
    if not target:
        raise RuntimeError("SWITCHBOARD_TEMPORAL_ADDRESS is not set")
    return await Client.connect(
        target, namespace=settings.temporal_namespace, data_converter=pydantic_data_converter, lazy=lazy
    )
