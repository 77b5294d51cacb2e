"""HTTP/2 on both sides of the sidecar (issue 5), on real sockets.

Downstream: hypercorn serving StreamGuard + ProxyApp (in-process, as `--http2` does), spoken
to by a raw `h2` client (tests/support/h2peers.py) and httpx with `http2=True`. Upstream:
`h2c://` against a raw h2 server that records each RST_STREAM and its error code, or hypercorn
serving the emulator or a test app. The real `python -m sidecar --http2` as a child process
(with curl and h2load): tests/system/test_http2_cli.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from h2.errors import ErrorCodes

from middleware.guard import StreamGuard
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from sidecar.proxy import ProxyApp
from sidecar.servers.hypercorn_listener import HypercornListener
from sidecar.upstream.h2 import STREAM_WINDOW, HTTP2Pool
from sidecar.upstream.types import Upstream
from tests.support.clients import request as h1_request
from tests.support.h2peers import ClientStream, H2Client, RecordingUpstream
from tests.support.servers import bound_socket, serve
from tests.support.sseparse import parse

STREAM = "/v1/stream?ttft_ms=0&itl_ms={itl}&tokens={tokens}"


@contextlib.asynccontextmanager
async def sidecar(upstream: str, **guard: Any) -> AsyncIterator[tuple[int, ProxyApp]]:
    """The sidecar's traffic app (StreamGuard over ProxyApp) on the `--http2` listener."""
    settings = load(["--http2", "--upstream", upstream, "--log-level", "warning"], {})
    proxy = ProxyApp(settings.upstream)
    options: dict[str, Any] = {"keepalive_interval": None, **guard}
    listener = HypercornListener(StreamGuard(proxy, **options), settings, bound_socket())
    task = asyncio.create_task(listener.serve())
    try:
        for _ in range(400):
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", listener.port)
                writer.close()
                break
            await asyncio.sleep(0.005)
        yield listener.port, proxy
    finally:
        listener.should_exit = True
        await asyncio.wait_for(task, 10)


def done_ok(stream: ClientStream, tokens: int) -> None:
    """`stream` is a complete emulator chat stream of `tokens` content tokens."""
    assert stream.status == 200 and stream.reset_code is None
    events = [event[1] for event in parse(stream.body)]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(data) for data in events[:-1]]
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) == tokens


# --- downstream: resets, multiplexing, guard rules over HTTP/2 ------------------------------


@pytest.mark.parametrize("upstream_kind", ["h2c", "http"])
async def test_client_reset_cancels_the_upstream_within_50ms_p99(upstream_kind: str) -> None:
    """A client's RST_STREAM reaches hypercorn as http.disconnect and the guard cancels the
    upstream at once: an h2c upstream receives RST_STREAM(CANCEL), an HTTP/1.1 upstream (the
    emulator) sees its client leave, within 50 ms at p99 over 100 streams."""
    samples: list[float] = []
    if upstream_kind == "h2c":
        async with (
            RecordingUpstream().running() as up,
            sidecar(f"h2c://127.0.0.1:{up.port}") as (port, _),
            H2Client(port).connected() as client,
        ):
            for i in range(100):
                stream = client.request("/hold", headers=[("x-probe", str(i))])
                await asyncio.wait_for(stream.first_data.wait(), 5)
                sent = client.reset(stream)
                await up.wait_for(lambda i=i: any(r.probe == str(i) for r in up.resets))
                reset = next(r for r in up.resets if r.probe == str(i))
                assert reset.error_code == ErrorCodes.CANCEL
                samples.append(reset.at - sent)
            assert up.connections == 1
    else:
        stats = Stats()
        async with (
            serve(make_app(stats=stats)) as up_port,
            sidecar(f"http://127.0.0.1:{up_port}") as (port, _),
            H2Client(port).connected() as client,
        ):
            for i in range(100):
                stream = client.request(STREAM.format(itl=5000, tokens=5))
                await asyncio.wait_for(stream.first_data.wait(), 5)
                sent = client.reset(stream)
                async with asyncio.timeout(5):
                    # The emulator stamps the cancel itself; polling only waits for it.
                    while stats.streams_cancelled <= i:  # noqa: ASYNC110
                        await asyncio.sleep(0.001)
                samples.append(stats.cancel_times[-1] - sent)
    p99 = statistics.quantiles(samples, n=100)[98]
    assert p99 < 0.05, f"p99 {p99 * 1000:.1f} ms"


async def test_100_concurrent_streams_on_one_connection_arrive_intact_and_interleaved() -> None:
    """100 streams multiplexed on one client connection, proxied over h2c to hypercorn serving
    the emulator: every stream arrives complete, and their DATA frames interleave (every
    stream had data before the first stream ended). Upstream they share few connections."""
    tokens = 12
    async with (
        serve(make_app(stats=Stats()), "hypercorn") as up_port,
        sidecar(f"h2c://127.0.0.1:{up_port}") as (port, proxy),
        H2Client(port).connected() as client,
    ):
        streams = [client.request(STREAM.format(itl=60, tokens=tokens)) for _ in range(100)]
        async with asyncio.timeout(30):
            await asyncio.gather(*(s.ended.wait() for s in streams))
        assert isinstance(proxy.pool, HTTP2Pool)
        assert 1 <= len(proxy.pool.connections) <= 2
    for stream in streams:
        done_ok(stream, tokens)
    first_end = min(s.arrivals[-1][0] for s in streams)
    assert all(s.arrivals[0][0] < first_end for s in streams)
    switches = sum(a != b for a, b in zip(client.data_order, client.data_order[1:], strict=False))
    # One stream after another makes about len(streams) switches; interleaved tokens make about
    # one per frame (~1,300 here), fewer when a loaded machine batches a stream's frames.
    assert switches > 5 * len(streams)


async def test_guard_rules_hold_over_http2() -> None:
    """Over HTTP/2 the guard sends headers at once, SSE keep-alive comments while the upstream
    is silent, and on idle timeout one terminal error event, then ends the stream cleanly."""
    async with (
        RecordingUpstream().running() as up,
        sidecar(f"h2c://127.0.0.1:{up.port}", keepalive_interval=0.1, idle_timeout=0.45) as (
            port,
            _,
        ),
        H2Client(port).connected() as client,
    ):
        stream = client.request("/hold", headers=[("x-probe", "idle")])
        await asyncio.wait_for(stream.ended.wait(), 5)
        await up.wait_for(lambda: any(r.probe == "idle" for r in up.resets))
    assert stream.status == 200 and stream.reset_code is None
    assert stream.header(b"cache-control") == b"no-cache, no-transform"
    body = stream.body
    assert body.startswith(b"data: 0\n\n: keep-alive\n")
    last = json.loads(parse(body)[-1][1])
    assert last["error"]["code"] == "idle_timeout"


async def test_one_client_connection_carries_more_than_1000_requests() -> None:
    """A long-lived HTTP/2 client connection (a mesh or ingress keeps one for hours) gets an
    answer to every request: 1,200 requests in batches of 100, all 200, none refused by a
    GOAWAY after hypercorn's default of 1,000 requests per connection."""
    async with (
        RecordingUpstream().running() as up,
        sidecar(f"h2c://127.0.0.1:{up.port}") as (port, _),
        H2Client(port).connected() as client,
    ):
        streams: list[ClientStream] = []
        for _ in range(12):
            batch = [client.request("/ok") for _ in range(100)]
            await asyncio.wait_for(asyncio.gather(*(s.ended.wait() for s in batch)), 10)
            streams += batch
    assert [(s.status, s.body) for s in streams] == [(200, b"ok")] * 1200


async def test_httpx_http2_client_against_the_sidecar() -> None:
    """httpx with http2=True negotiates HTTP/2 (prior knowledge) and streams SSE through."""
    async with (
        serve(make_app(stats=Stats())) as up_port,
        sidecar(f"http://127.0.0.1:{up_port}") as (port, _),
        httpx.AsyncClient(http1=False, http2=True, timeout=10) as client,
    ):
        url = f"http://127.0.0.1:{port}" + STREAM.format(itl=1, tokens=4)
        results = await asyncio.gather(*(client.get(url) for _ in range(8)))
    for response in results:
        assert response.http_version == "HTTP/2" and response.status_code == 200
        assert parse(response.content)[-1][1] == "[DONE]"


# --- flow control --------------------------------------------------------------------------


async def test_slow_http2_client_pauses_its_own_upstream_stream_only() -> None:
    """A client that stops opening one stream's window pauses that stream alone, up to the
    upstream: the h2c upstream (sending as fast as its window allows) has sent at most a few
    windows' worth on it while another stream on the same client connection and the same
    upstream connection moves 4 MiB; opened again, the slow stream completes intact."""
    mib = 1024 * 1024
    async with (
        RecordingUpstream().running() as up,
        sidecar(f"h2c://127.0.0.1:{up.port}", send_timeout=None) as (port, proxy),
        H2Client(port).connected() as client,
    ):
        slow = client.request(f"/firehose/slow/{4 * mib}", hold=True)
        fast = client.request(f"/firehose/fast/{4 * mib}")
        await asyncio.wait_for(fast.ended.wait(), 20)
        fast_bytes, slow_upstream = len(fast.body), up.sent["slow"]
        assert isinstance(proxy.pool, HTTP2Pool) and len(proxy.pool.connections) == 1
        client.release(slow)
        await asyncio.wait_for(slow.ended.wait(), 20)
    assert fast_bytes == 4 * mib and up.connections == 1
    # client window + hypercorn's stream buffer (high water) + the proxy's stream window
    # + one frame in flight at each hop
    bound = 65535 + 32768 + STREAM_WINDOW + 3 * 16384
    assert 0 < slow_upstream <= bound, slow_upstream
    assert len(slow.body) == 4 * mib and slow.body.count(b"\n\n") == 4 * mib // 1024


# --- upstream: RST_STREAM(CANCEL) and stream accounting -------------------------------------


Request = tuple[bytes, bytes, list[tuple[bytes, bytes]]]


def get(path: str, port: int, probe: str) -> Request:
    """(method, target, headers) for `HTTP2Pool.exchange`."""
    return (
        b"GET",
        path.encode(),
        [(b"host", f"127.0.0.1:{port}".encode()), (b"x-probe", probe.encode())],
    )


class Abandon(Exception):
    pass


async def test_1000_cancelled_streams_are_reset_and_leave_the_connection_usable() -> None:
    """1,000 streams abandoned in a row — half cancelled before the response headers, half
    mid-body — each reach the upstream as RST_STREAM(CANCEL); h2's open-stream count returns
    to zero (httpcore 1.0.x drifts here until `Max outbound streams`), and the same
    connection then carries 100 concurrent requests."""
    async with RecordingUpstream().running() as up:
        pool = HTTP2Pool(Upstream.parse(f"h2c://127.0.0.1:{up.port}"))
        try:
            for i in range(1000):
                probe = str(i)
                if i % 2:
                    with contextlib.suppress(Abandon):
                        async with pool.exchange(*get("/hold", up.port, probe)) as response:
                            async for _ in response.body:
                                raise Abandon
                else:
                    task = asyncio.create_task(_headers(pool, get("/silent", up.port, probe)))
                    await up.wait_for(lambda probe=probe: probe in up.requests.values())
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await up.wait_for(lambda: len(up.resets) == 1000)
            (connection,) = pool.connections
            assert connection.open_streams == 0
            statuses = await asyncio.gather(
                *(_headers(pool, get("/ok", up.port, f"ok{i}")) for i in range(100))
            )
            assert statuses == [200] * 100
            assert pool.connections == [connection] and connection.open_streams == 0
        finally:
            await pool.aclose()
    assert up.connections == 1
    assert {r.error_code for r in up.resets} == {ErrorCodes.CANCEL}
    assert sorted(int(r.probe or -1) for r in up.resets) == list(range(1000))


async def _headers(pool: HTTP2Pool, request: Request) -> int:
    async with pool.exchange(*request) as response:
        async for _ in response.body:
            pass
        return response.status


async def test_downstream_http1_disconnect_resets_the_h2c_upstream_stream() -> None:
    """An HTTP/1.1 client that goes away mid-stream makes the sidecar reset its h2c upstream
    stream with RST_STREAM(CANCEL), while the upstream connection stays up for the next one."""
    async with (
        RecordingUpstream().running() as up,
        sidecar(f"h2c://127.0.0.1:{up.port}") as (port, _),
    ):
        response = await h1_request(port, "GET", "/hold", headers=[("x-probe", "h1")])
        assert await asyncio.wait_for(response.chunk(), 5) == b"data: 0\n\n"
        response.close()
        await up.wait_for(lambda: any(r.probe == "h1" for r in up.resets))
        again = await h1_request(port, "GET", "/ok")
        assert again.status == 200
        again.close()
    assert [r.error_code for r in up.resets] == [ErrorCodes.CANCEL]
    assert up.connections == 1
