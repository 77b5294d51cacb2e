"""The admin port as another pod sees it: probes and metrics answer, `POST /drain` and the
live view answer 403 and do nothing, unless the caller has the `--admin-token-file` token;
loopback (the sidecar's own preStop hook) drains without one.

"Another pod" is a network namespace joined to this one by a veth pair, made by the test
(`tests/support/otherpod.py`, root and iproute2): a client bound to this machine's address on
the pair, or a process inside the namespace. The admin listener binds 0.0.0.0, as in k8s/.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from middleware.registry import StreamRegistry
from sidecar.admin import AdminApp, UpstreamHealth
from sidecar.admin_access import AdminToken
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from sidecar.injector.drain import DRAIN_SCRIPT
from tests.support.clients import read_response
from tests.support.otherpod import OtherPod, other_pod
from tests.support.servers import serve

TOKEN = "other-pod-admin-token-7c41d2e9b0a35f68"
PROBES = ("/livez", "/readyz", "/metrics")
CONTROL = (("GET", "/streams"), ("GET", "/streams/events"), ("GET", "/"), ("HEAD", "/"))


@pytest.fixture(scope="module")
def pod() -> Iterator[OtherPod]:
    with other_pod() as made:
        yield made


@pytest.fixture
async def upstream() -> AsyncIterator[int]:
    async with serve(make_app(stats=Stats())) as port:
        yield port


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def error(self) -> str:
        assert self.headers.get("content-type") == "application/json", self.headers
        return str(json.loads(self.body)["error"]["code"])


async def call(
    port: int, method: str, path: str, *, source: str, host: str, headers: str = ""
) -> Answer:
    """One request from `source` (the client socket's bound address) to `host`:`port`."""
    reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: admin\r\n{headers}\r\n".encode())
        response = await read_response(reader, writer)
        body = b"" if path == "/streams/events" or method == "HEAD" else await response.body()
        return Answer(response.status, {k.lower(): v for k, v in response.headers}, body)
    finally:
        writer.close()


def admin_app(upstream: int, token: str | None = None) -> tuple[AdminApp, list[bool]]:
    settings = load(["--upstream", f"http://127.0.0.1:{upstream}"], environ={})
    drains: list[bool] = []
    app = AdminApp(
        StreamRegistry(),
        UpstreamHealth(settings.upstream, "/health"),
        lambda: drains.append(True),
        token=AdminToken(token.encode()) if token else None,
    )
    return app, drains


@pytest.mark.parametrize("listen", ["0.0.0.0", "::"])
async def test_from_another_address_probes_answer_and_control_is_refused(
    pod: OtherPod, upstream: int, listen: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No token configured, a peer on another address (also as ::ffff:A on a dual-stack
    listener): /livez, /readyz, /metrics 200; POST /drain 403 and no drain, even with
    forwarding headers naming 127.0.0.1; the live view 403; the same from loopback works."""
    app, drains = admin_app(upstream)
    forged = "X-Forwarded-For: 127.0.0.1\r\nForwarded: for=127.0.0.1\r\nX-Real-IP: 127.0.0.1\r\n"
    async with serve(app, host=listen, proxy_headers=False) as port:
        other = {"source": pod.host_address, "host": pod.host_address}
        for path in PROBES:
            assert (await call(port, "GET", path, **other)).status == 200, path
        for headers in ("", forged, f"Authorization: Bearer {TOKEN}\r\n"):
            refused = await call(port, "POST", "/drain", **other, headers=headers)
            assert refused.status == 403 and refused.error() == "forbidden"
        for method, path in CONTROL:
            assert (await call(port, method, path, **other)).status == 403, (method, path)
        assert drains == []
        assert (await call(port, "GET", "/readyz", **other)).status == 200  # still ready

        local = {"source": "127.0.0.1", "host": "127.0.0.1"}
        for method, path in CONTROL:
            assert (await call(port, method, path, **local)).status == 200, (method, path)
        assert (await call(port, "POST", "/drain", **local)).status == 202
    assert drains == [True]
    refusals = [r.getMessage() for r in caplog.records if "refused POST /drain" in r.getMessage()]
    assert len(refusals) == 3 and pod.host_address in refusals[0]


async def test_from_another_address_the_token_lets_a_caller_in(
    pod: OtherPod, upstream: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A token configured: from another address, a missing or wrong token is 403 and no
    drain; `Authorization: Bearer <token>` opens the live view and starts the drain (202).
    No log line holds the token."""
    caplog.set_level(logging.DEBUG)
    app, drains = admin_app(upstream, TOKEN)
    async with serve(app, host="0.0.0.0", proxy_headers=False) as port:
        other = {"source": pod.host_address, "host": pod.host_address}
        for headers in (
            "",
            f"Authorization: Bearer {TOKEN[:-1]}x\r\n",
            f"Authorization: Basic {TOKEN}\r\n",
        ):
            refused = await call(port, "POST", "/drain", **other, headers=headers)
            assert refused.status == 403 and refused.error() == "forbidden"
            assert b"admin token" in refused.body and TOKEN.encode() not in refused.body
        assert drains == []
        bearer = f"Authorization: Bearer {TOKEN}\r\n"
        for method, path in CONTROL:
            answer = await call(port, method, path, **other, headers=bearer)
            assert answer.status == 200, (method, path)
        assert (await call(port, "POST", "/drain", **other, headers=bearer)).status == 202
    assert drains == [True]
    assert TOKEN not in caplog.text and TOKEN[:-1] not in caplog.text


# --- the sidecar process, and a client inside the other pod's namespace ------------------------

# Run inside the other pod: each request on its own connection; prints [[status, body]].
CLIENT = """\
import http.client, json, sys
host, port, source = sys.argv[1], int(sys.argv[2]), sys.argv[3]
answers = []
for method, path, headers in json.loads(sys.argv[4]):
    connection = http.client.HTTPConnection(host, port, timeout=10, source_address=(source, 0))
    connection.request(method, path, headers=headers)
    response = connection.getresponse()
    streaming = response.getheader("content-type", "").startswith("text/event-stream")
    answers.append([response.status, "" if streaming else response.read().decode()])
    connection.close()
print(json.dumps(answers))
"""


async def from_pod(pod: OtherPod, port: int, *requests: tuple[str, str, dict[str, str]]) -> Any:
    argv = [sys.executable, "-c", CLIENT, pod.host_address, str(port), pod.pod_address]
    client = await asyncio.create_subprocess_exec(
        *pod.command(*argv, json.dumps(requests)), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(client.communicate(), 30)
    assert client.returncode == 0, err.decode()
    return json.loads(out)


class Sidecar:
    """`python -m sidecar` with its admin listener on 0.0.0.0 (a free port, learnt from the
    ready file), as k8s/ runs it."""

    def __init__(self, upstream: int, tmp_path: Path, *flags: str) -> None:
        self.ready_file = tmp_path / "ready.json"
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "sidecar",
                "--upstream", f"http://127.0.0.1:{upstream}",
                "--listen", "127.0.0.1:0",
                "--admin-listen", "0.0.0.0:0",
                "--ready-file", str(self.ready_file),
                "--drain-timeout", "5",
                *flags,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        self.admin = 0

    async def ready(self) -> int:
        for _ in range(2000):
            assert self.process.poll() is None, self.process.communicate()[1].decode()
            if self.ready_file.exists():
                self.admin = int(
                    json.loads(self.ready_file.read_text())["admin"].rpartition(":")[2]
                )
                return self.admin
            await asyncio.sleep(0.01)
        raise TimeoutError("the sidecar did not write its ready file")

    async def exit(self, timeout: float) -> tuple[int, str]:
        _, err = await asyncio.wait_for(asyncio.to_thread(self.process.communicate), timeout)
        return self.process.returncode, err.decode()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


async def local_status(port: int, path: str, method: str = "GET") -> int:
    answer = await call(port, method, path, source="127.0.0.1", host="127.0.0.1")
    return answer.status


async def test_other_pod_cannot_drain_the_sidecar_without_the_token(
    pod: OtherPod, upstream: int, tmp_path: Path
) -> None:
    """The sidecar process, admin on 0.0.0.0 with --admin-token-file: from inside another
    network namespace, probes and metrics 200; POST /drain and the live view 403 and the
    sidecar stays ready; with the token the drain starts (202) and the process exits 0. The
    token is in no log line and not in the ready file."""
    token_file = tmp_path / "admin-token"
    token_file.write_text(f"{TOKEN}\n")
    sidecar = Sidecar(upstream, tmp_path, "--admin-token-file", str(token_file))
    try:
        port = await sidecar.ready()
        wrong = {"Authorization": f"Bearer {TOKEN[::-1]}"}
        answers = await from_pod(
            pod,
            port,
            *[("GET", path, {}) for path in PROBES],
            ("POST", "/drain", {}),
            ("POST", "/drain", wrong),
            *[(method, path, {}) for method, path in CONTROL if method == "GET"],
            ("GET", "/readyz", {}),
        )
        assert [status for status, _ in answers] == [200, 200, 200, 403, 403, 403, 403, 403, 200]
        assert json.loads(answers[3][1])["error"]["code"] == "forbidden"
        assert await local_status(port, "/streams") == 200
        assert await local_status(port, "/readyz") == 200  # nothing happened
        assert sidecar.process.poll() is None

        bearer = {"Authorization": f"Bearer {TOKEN}"}
        [(drained, body)] = await from_pod(pod, port, ("POST", "/drain", bearer))
        assert drained == 202 and json.loads(body)["status"] == "draining"
        code, err = await sidecar.exit(timeout=10)
    finally:
        sidecar.kill()
    assert code == 0
    assert "refused POST /drain" in err and pod.pod_address in err
    assert TOKEN not in err and TOKEN not in sidecar.ready_file.read_text()


async def test_prestop_hook_drains_over_loopback_without_a_token(
    upstream: int, tmp_path: Path
) -> None:
    """The preStop drain hook k8s/ and the injector give the native sidecar (it runs in the
    sidecar's container, so it calls from loopback) drains the sidecar whose admin port is on
    0.0.0.0 with no token configured: the hook returns 0 and the sidecar exits 0."""
    sidecar = Sidecar(upstream, tmp_path)
    try:
        port = await sidecar.ready()
        script = DRAIN_SCRIPT.format(admin_port=port, propagation=0)
        hook = await asyncio.create_subprocess_exec(sys.executable, "-c", script)
        code, err = await sidecar.exit(timeout=15)
        assert await asyncio.wait_for(hook.wait(), 15) == 0
    finally:
        sidecar.kill()
    assert code == 0 and "refused" not in err


async def test_bad_token_file_stops_the_start_with_one_line(upstream: int, tmp_path: Path) -> None:
    """An empty --admin-token-file: exit 2 before any port opens, one line naming the flag."""
    empty = tmp_path / "empty"
    empty.write_text("")
    sidecar = Sidecar(upstream, tmp_path, "--admin-token-file", str(empty))
    try:
        code, err = await sidecar.exit(timeout=30)
    finally:
        sidecar.kill()
    assert code == 2 and err.count("\n") == 1
    assert "--admin-token-file" in err and "empty" in err
    assert not sidecar.ready_file.exists()
