"""A Redis store with a password and with TLS: the sidecar CLI (`--resume`) against a real
`redis-server --requirepass`, and a real `redis-server` serving TLS only (`--tls-port`,
Debian's build) with a certificate issued here by a throwaway CA (`cryptography`).

The store logs in with the password from the URL or from `--resume-store-password-file`, and
checks the server's certificate against the system's CAs and `--resume-store-ca`. A store it
cannot use is one warning line, never an exit: traffic flows, resume answers 503. No line the
sidecar writes carries the password."""

from __future__ import annotations

import datetime
import ipaddress
import json
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sidecar.emulator import Stats, make_app
from tests.support.clients import request
from tests.support.procs import CHAT, Child, chat
from tests.support.redis import TLSFiles, redis_server, store_flags
from tests.support.servers import serve
from tests.support.sseparse import parse

PASSWORD = "p@ss:w/rd-of-the-redis-server"  # characters a URL must percent-encode
WRONG = "not-the-redis-password"
OWNER = [("Authorization", "Bearer tenant-a")]


@pytest.fixture
async def emulator() -> AsyncIterator[int]:
    async with serve(make_app(stats=Stats())) as port:
        yield port


def pki(directory: Path) -> TLSFiles:
    """A throwaway CA and a server certificate it issued for 127.0.0.1, as PEM files."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-redis-ca")])

    def certificate(
        subject: x509.Name, public: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    ca = certificate(ca_name, ca_key.public_key()).add_extension(
        x509.BasicConstraints(ca=True, path_length=None), critical=True
    )
    server = certificate(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]), key.public_key()
    ).add_extension(
        x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
        critical=False,
    )
    files = TLSFiles(
        cert=str(directory / "server.pem"),
        key=str(directory / "server.key"),
        ca=str(directory / "ca.pem"),
    )
    pem = serialization.Encoding.PEM
    Path(files.ca).write_bytes(ca.sign(ca_key, hashes.SHA256()).public_bytes(pem))
    Path(files.cert).write_bytes(server.sign(ca_key, hashes.SHA256()).public_bytes(pem))
    private = serialization.PrivateFormat.PKCS8
    Path(files.key).write_bytes(key.private_bytes(pem, private, serialization.NoEncryption()))
    return files


async def start(upstream: int, *flags: str) -> Child:
    child = Child(upstream, "--resume", *flags)
    await child.ready()
    return child


def stop(child: Child) -> str:
    """End the sidecar; everything it wrote to stderr."""
    child.process.kill()
    child.process.wait()
    assert child.process.stderr is not None
    err = child.process.stderr.read().decode()
    child.kill()
    return err


async def drop_and_resume(port: int) -> tuple[list[tuple[str, str, str]], int]:
    """A stream whose client drops after 4 events, then resumed on the same sidecar (answered
    from the store: Redis): every event, and the resume's status."""
    first = await request(port, "POST", CHAT, body=chat(40, 10), headers=OWNER)
    stream_id = first.header("sidestream-stream-id")
    body = b""
    while len(parse(body)) < 4:
        chunk = await first.chunk()
        assert chunk is not None, body
        body += chunk
    first.close()
    resumed = [*OWNER, ("Last-Event-ID", f"{stream_id}:4")]
    rest = await request(port, "POST", CHAT, body=chat(40, 10), headers=resumed)
    tail = await rest.body()
    rest.close()
    events = parse(body)[:4] + (parse(tail) if rest.status == 200 else [])
    assert [e[2] for e in events[:4]] == [f"{stream_id}:{n}" for n in range(1, 5)]
    return events, rest.status


async def unavailable(port: int) -> tuple[list[tuple[str, str, str]], int, str]:
    """A whole stream, then a resume of it: its events, the resume's status and error code."""
    first = await request(port, "POST", CHAT, body=chat(5, 0), headers=OWNER)
    events = parse(await first.body())
    first.close()
    stream_id = first.header("sidestream-stream-id")
    again = await request(port, "GET", f"/sidestream/v1/streams/{stream_id}", headers=OWNER)
    error = json.loads(await again.body())["error"]["code"]
    again.close()
    assert events[0][2] == f"{stream_id}:1"
    return events, again.status, error


def no_password(err: str, *passwords: str) -> None:
    for password in passwords:
        for form in (password, urllib.parse.quote(password, safe="")):
            assert form not in err, err


@pytest.mark.parametrize("where", ["url", "file"])
async def test_a_password_in_the_url_or_a_file_logs_in_and_resume_works(
    emulator: int, tmp_path: Path, where: str
) -> None:
    """Rule: against `redis-server --requirepass`, the password given in the URL
    (`redis://default:PASSWORD@…`, percent-encoded) or in `--resume-store-password-file` logs
    in: a dropped stream resumes from Redis to its end; no warning, and no line carries the
    password."""
    async with redis_server("--requirepass", PASSWORD) as server:
        host = server.url.removeprefix("redis://")
        if where == "url":
            flags = store_flags(f"redis://default:{urllib.parse.quote(PASSWORD, safe='')}@{host}")
        else:
            (tmp_path / "password").write_text(PASSWORD + "\n")
            flags = (
                *store_flags(server.url),
                "--resume-store-password-file",
                str(tmp_path / "password"),
            )
        child = await start(emulator, *flags)
        try:
            events, status = await drop_and_resume(child.port)
        finally:
            err = stop(child)
    assert status == 200, err
    assert events[-1][1] == "[DONE]" and len(events) > 40
    assert [e[2].split(":")[1] for e in events] == [str(n) for n in range(1, len(events) + 1)]
    assert "resume store" not in err, err
    no_password(err, PASSWORD)


async def test_a_wrong_password_is_one_warning_line_and_traffic_flows(emulator: int) -> None:
    """Rule: a store that refuses the password never stops traffic or start-up: streams flow,
    named and stamped; a resume gets 503 resume_store_unavailable; stderr has one warning line
    naming the store, with `***` for the password, and neither password anywhere."""
    async with redis_server("--requirepass", PASSWORD) as server:
        url = server.url.replace("redis://", f"redis://default:{WRONG}@")
        child = await start(emulator, *store_flags(url))
        try:
            events, status, code = await unavailable(child.port)
            for _ in range(3):  # more failed writes and reads: still the one line
                await unavailable(child.port)
            alive = child.process.poll() is None
        finally:
            err = stop(child)
    assert alive and events[-1][1] == "[DONE]"
    assert (status, code) == (503, "resume_store_unavailable")
    lines = [line for line in err.splitlines() if "resume store" in line]
    assert len(lines) == 1 and "WARNING" in lines[0], err
    assert "default:***@127.0.0.1" in lines[0] and "invalid username-password" in lines[0], err
    no_password(err, PASSWORD, WRONG)


async def test_tls_with_the_ca_file_and_a_password_file_resumes(
    emulator: int, tmp_path: Path
) -> None:
    """Rule: `rediss://` with `--resume-store-ca` (the CA that issued the server's certificate,
    checked for 127.0.0.1) and the password from a file: a dropped stream resumes from a
    Redis that serves TLS only; no warning, and no line carries the password."""
    files = pki(tmp_path)
    (tmp_path / "password").write_text(PASSWORD)
    async with redis_server("--requirepass", PASSWORD, tls=files) as server:
        flags = [*store_flags(server.url), "--resume-store-ca", files.ca]
        flags += ["--resume-store-password-file", str(tmp_path / "password")]
        child = await start(emulator, *flags)
        try:
            events, status = await drop_and_resume(child.port)
        finally:
            err = stop(child)
    assert server.url.startswith("rediss://")
    assert status == 200, err
    assert events[-1][1] == "[DONE]" and len(events) > 40
    assert "resume store" not in err, err
    no_password(err, PASSWORD)


async def test_tls_without_the_ca_is_an_unavailable_store_and_traffic_flows(
    emulator: int, tmp_path: Path
) -> None:
    """Rule: a `rediss://` store whose certificate no trusted CA issued (the system's CAs only)
    is unavailable, never trusted: one warning line naming the certificate failure, streams
    flow, a resume gets 503 resume_store_unavailable."""
    files = pki(tmp_path)
    async with redis_server(tls=files) as server:
        child = await start(emulator, *store_flags(server.url))
        try:
            events, status, code = await unavailable(child.port)
            alive = child.process.poll() is None
        finally:
            err = stop(child)
    assert alive and events[-1][1] == "[DONE]"
    assert (status, code) == (503, "resume_store_unavailable")
    lines = [line for line in err.splitlines() if "resume store" in line]
    assert len(lines) == 1 and "WARNING" in lines[0], err
    assert "CERTIFICATE_VERIFY_FAILED" in lines[0] or "certificate verify" in lines[0], err
