"""TLS to the upstream (`https://`): h2 or HTTP/1.1 by ALPN, cancellation on both, certificate
errors as 502 `upstream_tls_error`; and a connect timeout as 504 `upstream_timeout`.

The upstream is the emulator on hypercorn with TLS, its certificate issued by a CA made here
with `cryptography`; the sidecar is StreamGuard over ProxyApp on the sidecar's uvicorn
listener (so an HTTP/1.1 upstream read also takes the `send_nowait` path over TLS).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from middleware.guard import StreamGuard
from sidecar.emulator import Stats, make_app
from sidecar.proxy import ProxyApp
from sidecar.upstream.h1pool import H1Pool
from sidecar.upstream.h2 import HTTP2Pool
from sidecar.upstream.pools import ALPNPool
from sidecar.upstream.tls import UpstreamTLS
from sidecar.upstream.types import Upstream
from tests.support.clients import request
from tests.support.servers import serve

STREAM = "/v1/stream?ttft_ms=0&itl_ms=20&tokens=500"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca(
    directory: Path, name: str
) -> tuple[Path, x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    path = directory / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate it issued for 127.0.0.1, and an unrelated CA."""
    directory = tmp_path_factory.mktemp("pki")
    ca_path, ca_cert, ca_key = make_ca(directory, "test-ca")
    other_path, _, _ = make_ca(directory, "other-ca")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    certfile, keyfile = directory / "server.pem", directory / "server.key"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return {"ca": ca_path, "other": other_path, "cert": certfile, "key": keyfile}


@contextlib.asynccontextmanager
async def tls_emulator(pki: dict[str, Path], alpn: list[str], stats: Stats) -> AsyncIterator[int]:
    """The emulator on hypercorn with TLS, offering `alpn`."""
    options = {"certfile": str(pki["cert"]), "keyfile": str(pki["key"]), "alpn_protocols": alpn}
    async with serve(make_app(stats=stats), "hypercorn", **options) as port:
        yield port


@contextlib.asynccontextmanager
async def sidecar(
    upstream: str, tls: UpstreamTLS, **proxy: float
) -> AsyncIterator[tuple[int, ProxyApp]]:
    app = ProxyApp(Upstream.parse(upstream), tls=tls, **proxy)  # type: ignore[arg-type]
    guard = StreamGuard(app, keepalive_interval=None)
    async with serve(guard, "sidecar") as port:  # type: ignore[arg-type]
        yield port, app


@pytest.mark.parametrize(
    ("alpn", "pool"), [(["h2", "http/1.1"], HTTP2Pool), (["http/1.1"], H1Pool)]
)
async def test_https_upstream_streams_by_alpn_and_a_disconnect_cancels_it(
    pki: dict[str, Path], alpn: list[str], pool: type
) -> None:
    """`https://` with `--upstream-ca`: the pool follows the upstream's ALPN choice (h2 when
    offered, else HTTP/1.1 over TLS), tokens stream through, and a client disconnect ends
    the upstream stream (RST_STREAM on h2, the connection closed on HTTP/1.1): the emulator
    counts it cancelled."""
    stats = Stats()
    async with (
        tls_emulator(pki, alpn, stats) as upstream_port,
        sidecar(f"https://127.0.0.1:{upstream_port}", UpstreamTLS(ca=str(pki["ca"]))) as (
            port,
            app,
        ),
    ):
        response = await request(port, "GET", STREAM)
        assert response.status == 200
        received = b""
        while received.count(b"data:") < 3:
            chunk = await asyncio.wait_for(response.chunk(), 5)
            assert chunk is not None
            received += chunk
        assert isinstance(app.pool, ALPNPool) and isinstance(app.pool.chosen, pool)
        response.close()
        # The emulator counts the cancel itself; this only waits for it, bounded.
        async with asyncio.timeout(5):
            while stats.streams_cancelled < 1:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert stats.streams_completed == 0


@pytest.mark.parametrize("tls", ["other-ca", "system-cas"])
async def test_an_upstream_certificate_not_trusted_is_502_upstream_tls_error(
    pki: dict[str, Path], tls: str
) -> None:
    """A certificate the configured CAs (or the system's) do not vouch for is refused: 502
    JSON with code `upstream_tls_error` and OpenSSL's reason; no request reaches the upstream."""
    stats = Stats()
    ca = str(pki["other"]) if tls == "other-ca" else None
    async with (
        tls_emulator(pki, ["h2", "http/1.1"], stats) as upstream_port,
        sidecar(f"https://127.0.0.1:{upstream_port}", UpstreamTLS(ca=ca)) as (port, _),
    ):
        response = await request(port, "GET", STREAM)
        body = json.loads(await response.body())
        response.close()
    assert response.status == 502
    assert body["error"]["code"] == "upstream_tls_error"
    assert "certificate verify failed" in body["error"]["message"]
    assert "BEGIN" not in body["error"]["message"]
    assert stats.streams_started == 0


async def test_insecure_accepts_any_upstream_certificate(pki: dict[str, Path]) -> None:
    """`--upstream-insecure` skips the check (tests only): the unknown CA's server streams."""
    stats = Stats()
    async with (
        tls_emulator(pki, ["h2", "http/1.1"], stats) as upstream_port,
        sidecar(f"https://127.0.0.1:{upstream_port}", UpstreamTLS(insecure=True)) as (port, _),
    ):
        response = await request(port, "GET", "/v1/stream?ttft_ms=0&itl_ms=0&tokens=3")
        body = await response.body()
        response.close()
    assert response.status == 200 and body.count(b"data:") >= 3


@pytest.mark.parametrize("scheme", ["http", "h2c", "https"])
async def test_a_connect_timeout_is_504_upstream_timeout(scheme: str) -> None:
    """A connect that does not complete within `--connect-timeout` is 504 JSON with code
    `upstream_timeout` (a refused one stays 502 `upstream_unreachable`). The upstream is a
    127.0.0.1 listener with backlog 0 that never accepts, its queue filled first, so the
    kernel drops further SYNs and the connect hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    upstream_port = listener.getsockname()[1]
    fillers: list[socket.socket] = []
    try:
        for _ in range(8):  # fill the accept queue: later connects hang in SYN_SENT
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", upstream_port))
            fillers.append(filler)
        upstream = f"{scheme}://127.0.0.1:{upstream_port}"
        async with sidecar(upstream, UpstreamTLS(), connect_timeout=0.3) as (port, _):
            async with asyncio.timeout(10):
                response = await request(port, "GET", STREAM)
                body = json.loads(await response.body())
            response.close()
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
    assert response.status == 504
    assert body["error"]["code"] == "upstream_timeout"


async def test_a_refused_connect_stays_502_upstream_unreachable() -> None:
    """Nothing listening: 502 `upstream_unreachable`, not a timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    upstream_port = listener.getsockname()[1]
    listener.close()
    async with sidecar(f"http://127.0.0.1:{upstream_port}", UpstreamTLS()) as (port, _):
        response = await request(port, "GET", STREAM)
        body = json.loads(await response.body())
        response.close()
    assert response.status == 502
    assert body["error"]["code"] == "upstream_unreachable"
