"""The Temporal connection: one client construction (data converter, metrics runtime, TLS and API key)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.service import TLSConfig

from switchboard import tracing
from switchboard.logs import install_masking
from switchboard.payload_codec import payload_codec
from switchboard.request_ids import RequestIdInterceptor
from switchboard.settings import Settings
from switchboard.temporal_runtime import temporal_runtime


async def connect(settings: Settings, address: str | None = None, *, lazy: bool = False) -> Client:
    """A client with the pydantic data converter, so models cross the wire as JSON.

    Its interceptors (which its workers inherit) carry the request id into workflows and activities, and, when
    tracing is on (switchboard/tracing.py), the trace context as well.
    """
    target = address or settings.temporal_address
    if not target:
        raise RuntimeError("SWITCHBOARD_TEMPORAL_ADDRESS is not set")
    return await Client.connect(
        target,
        namespace=settings.temporal_namespace,
        data_converter=data_converter(settings),
        lazy=lazy,
        # The process's one Runtime: the SDK's metrics (this client's and its workers') on its own exporter.
        runtime=temporal_runtime(settings),
        interceptors=[RequestIdInterceptor(), *tracing.interceptors()],
        **connect_security(settings),
    )


def data_converter(settings: Settings) -> DataConverter:
    """The pydantic converter, with the AES-GCM payload codec when SWITCHBOARD_PAYLOAD_KEY is set."""
    codec = payload_codec(settings.payload_key, settings.payload_old_keys)
    if codec is None:
        return pydantic_data_converter
    install_masking([settings.payload_key, *(k.strip() for k in settings.payload_old_keys.split(","))])
    return dataclasses.replace(pydantic_data_converter, payload_codec=codec)


def connect_security(settings: Settings) -> dict[str, Any]:
    """The `tls=` and `api_key=` arguments of Client.connect for these settings.

    Fails closed: a configured certificate, key or CA that cannot be read raises (the process refuses to start)
    rather than connecting without it. An API key alone turns on TLS with the system roots (Temporal Cloud).
    """
    options: dict[str, Any] = {}
    if settings.temporal_api_key:
        install_masking([settings.temporal_api_key])  # never in a log line, whoever logs it
        options["api_key"] = settings.temporal_api_key
    ca, cert, key = (
        settings.temporal_tls_ca_file,
        settings.temporal_tls_cert_file,
        settings.temporal_tls_key_file,
    )
    if ca or cert or key or settings.temporal_tls_server_name:
        options["tls"] = TLSConfig(
            server_root_ca_cert=_read_pem(ca, "SWITCHBOARD_TEMPORAL_TLS_CA_FILE") if ca else None,
            domain=settings.temporal_tls_server_name or None,
            client_cert=_read_pem(cert, "SWITCHBOARD_TEMPORAL_TLS_CERT_FILE") if cert else None,
            client_private_key=_read_pem(key, "SWITCHBOARD_TEMPORAL_TLS_KEY_FILE") if key else None,
        )
    elif settings.temporal_tls or settings.temporal_api_key:
        options["tls"] = True
    return options


def _read_pem(path: Path, setting: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RuntimeError(f"{setting}: cannot read {path}: {exc.strerror or exc}") from exc
    if b"-----BEGIN " not in data:
        raise RuntimeError(f"{setting}: {path} is not a PEM file")
    return data
