"""Temporal TLS, mTLS and API-key settings become the client's connect arguments, and a real TLS hop works."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from pydantic import ValidationError
from temporalio.service import TLSConfig
from temporalio.testing import WorkflowEnvironment

from switchboard.logs import mask_secrets
from switchboard.settings import Settings
from switchboard.temporal import connect, connect_security

SERVER_NAME = "temporal.test"


def test_no_tls_settings_mean_a_plain_connection() -> None:
    assert connect_security(Settings()) == {}


def test_tls_alone_uses_the_system_roots_and_an_api_key_turns_tls_on() -> None:
    assert connect_security(Settings(temporal_tls=True)) == {"tls": True}
    key = "tcld-key-" + "x" * 24
    assert connect_security(Settings(temporal_api_key=key)) == {"api_key": key, "tls": True}
    # The key is masked in every log line from then on.
    assert key not in mask_secrets(f"connecting with {key}")


def test_ca_client_pair_and_server_name_become_a_tls_config(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    settings = Settings(
        temporal_tls_ca_file=pki.ca_file,
        temporal_tls_cert_file=pki.client_cert_file,
        temporal_tls_key_file=pki.client_key_file,
        temporal_tls_server_name=SERVER_NAME,
        temporal_api_key="k" * 20,
    )
    options = connect_security(settings)
    assert options["api_key"] == "k" * 20
    tls = options["tls"]
    assert isinstance(tls, TLSConfig)
    assert tls.server_root_ca_cert == pki.ca_file.read_bytes()
    assert tls.client_cert == pki.client_cert_file.read_bytes()
    assert tls.client_private_key == pki.client_key_file.read_bytes()
    assert tls.domain == SERVER_NAME
    only_ca = connect_security(Settings(temporal_tls_ca_file=pki.ca_file))["tls"]
    assert only_ca.server_root_ca_cert and only_ca.client_cert is None and only_ca.domain is None


def test_broken_tls_settings_refuse_rather_than_connect_without(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    with pytest.raises(ValidationError, match="must be set together"):
        Settings(temporal_tls_cert_file=pki.client_cert_file)
    with pytest.raises(RuntimeError, match="SWITCHBOARD_TEMPORAL_TLS_CA_FILE: cannot read"):
        connect_security(Settings(temporal_tls_ca_file=tmp_path / "missing.pem"))
    (tmp_path / "not.pem").write_text("hello")
    with pytest.raises(RuntimeError, match="is not a PEM file"):
        connect_security(Settings(temporal_tls_ca_file=tmp_path / "not.pem"))
    # An empty variable (compose's `${VAR:-}`) is unset, never the current directory.
    blank = Settings.model_validate({"temporal_tls_ca_file": "", "temporal_api_key": " "})
    assert blank.temporal_tls_ca_file is None and blank.temporal_api_key is None
    assert connect_security(blank) == {}


class Pki:
    """A throwaway CA, a server certificate for SERVER_NAME (and 127.0.0.1) and a client certificate."""

    def __init__(self, folder: Path) -> None:
        now = dt.datetime.now(dt.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "switchboard test CA")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        self.ca_file = self._write(folder / "ca.pem", ca.public_bytes(serialization.Encoding.PEM))
        self.server_cert_file, self.server_key_file = self._leaf(folder, "server", ca, ca_key, now, server=True)
        self.client_cert_file, self.client_key_file = self._leaf(folder, "client", ca, ca_key, now, server=False)

    def _leaf(
        self,
        folder: Path,
        name: str,
        ca: x509.Certificate,
        ca_key: ec.EllipticCurvePrivateKey,
        now: dt.datetime,
        *,
        server: bool,
    ) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"switchboard test {name}")]))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName(SERVER_NAME), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        cert = builder.sign(ca_key, hashes.SHA256())
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return (
            self._write(folder / f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM)),
            self._write(folder / f"{name}-key.pem", key_pem),
        )

    @staticmethod
    def _write(path: Path, data: bytes) -> Path:
        path.write_bytes(data)
        return path


@contextlib.asynccontextmanager
async def tls_front(pki: Pki, upstream: str, *, require_client_cert: bool) -> AsyncIterator[str]:
    """A TLS-terminating TCP relay in front of the dev server (which speaks only plaintext gRPC)."""
    host, port = upstream.rsplit(":", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert_file, pki.server_key_file)
    context.set_alpn_protocols(["h2"])
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(pki.ca_file)

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    server = await asyncio.start_server(relay, "127.0.0.1", 0, ssl=context)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await server.wait_closed()


async def reachable(settings: Settings) -> bool:
    """Whether a connect with these settings reaches the server (a health check through the TLS hop)."""
    try:
        async with asyncio.timeout(20):
            client = await connect(settings)
            return await client.service_client.check_health()
    except Exception:
        return False


async def test_tls_and_mtls_settings_reach_a_real_server_and_fail_closed_without_them(
    tmp_path: Path, temporal_env: WorkflowEnvironment
) -> None:
    pki = Pki(tmp_path)
    upstream = temporal_env.client.service_client.config.target_host
    async with tls_front(pki, upstream, require_client_cert=False) as address:
        trusted = Settings(
            temporal_address=address, temporal_tls_ca_file=pki.ca_file, temporal_tls_server_name=SERVER_NAME
        )
        assert await reachable(trusted)
        # The system roots do not know this CA: refused, never downgraded to plaintext.
        assert not await reachable(Settings(temporal_address=address, temporal_tls=True))
        assert not await reachable(Settings(temporal_address=address))
    async with tls_front(pki, upstream, require_client_cert=True) as address:
        mutual = Settings(
            temporal_address=address,
            temporal_tls_ca_file=pki.ca_file,
            temporal_tls_server_name=SERVER_NAME,
            temporal_tls_cert_file=pki.client_cert_file,
            temporal_tls_key_file=pki.client_key_file,
        )
        assert await reachable(mutual)
        # Without the client certificate the server refuses the handshake.
        without = mutual.model_copy(update={"temporal_tls_cert_file": None, "temporal_tls_key_file": None})
        assert not await reachable(without)
