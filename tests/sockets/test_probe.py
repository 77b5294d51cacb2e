"""The probe's origin served by the sidecar (StreamGuard around the probe route) on real
sockets, read by the probe client over HTTP/1.1 and h2c."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator

import pytest

from middleware.guard import StreamGuard
from middleware.probe import ProbeApp, Shape
from middleware.registry import StreamRegistry
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.probe.analysis import Status, checks
from sidecar.probe.client import Target, read
from tests.support.clients import request
from tests.support.servers import serve


def sidecar(*flags: str) -> StreamGuard:
    """A sidecar whose upstream is a closed port: the probe must never need it."""
    settings = load(["--upstream", "http://127.0.0.1:1", *flags], environ={})
    return build_guard(settings, StreamRegistry())


@pytest.fixture
async def port() -> AsyncIterator[int]:
    async with serve(sidecar("--keepalive-interval", "0.3"), "sidecar") as bound:
        yield bound


async def get(port: int, query: str) -> tuple[int, dict[str, object]]:
    response = await request(port, "GET", f"/sidestream/v1/probe?{query}")
    try:
        data = await response.body()
    finally:
        response.close()
    return response.status, json.loads(data) if response.status != 200 else {}


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("events=0", "events"),
        ("events=1001", "events"),
        ("events=ten", "events"),
        ("interval_ms=-1", "interval_ms"),
        ("interval_ms=10001", "interval_ms"),
        ("pad=16385", "pad"),
        ("gap_s=101", "gap_s"),
        ("gap_s=nan", "gap_s"),
        ("keepalive=2", "keepalive"),
        ("colour=red", "colour"),
        ("events=2&events=3", "events"),
        ("events=1000&interval_ms=1000", "gap_s"),  # 1000 s: past MAX_SECONDS
        ("events=1000&pad=16384", "pad"),  # 16 MB: past MAX_BYTES
    ],
)
async def test_bad_parameters_get_400_naming_the_parameter(
    port: int, query: str, param: str
) -> None:
    """Rule: a malformed, unknown, repeated or out-of-bounds parameter is a 400 in the sidecar's
    error shape, naming the parameter (and its bounds where it has them)."""
    status, body = await get(port, query)
    assert status == 400
    error = body["error"]
    assert isinstance(error, dict)
    assert error["code"] == "bad_probe_parameter" and error["param"] == param
    assert error["type"] == "invalid_request_error" and param in error["message"]


async def test_probe_off_is_404_and_never_proxied() -> None:
    """Rule: `--probe off` answers the probe path 404 itself (the upstream is a closed port, so
    a proxied request would be a 502)."""
    async with serve(sidecar("--probe", "off"), "sidecar") as bound:
        status, body = await get(bound, "events=1")
    assert status == 404
    assert body["error"]["code"] == "probe_off"  # type: ignore[index]


async def test_probes_past_the_limit_get_429() -> None:
    """Rule: past `max_concurrent` probes in flight the next one is refused with 429 and
    Retry-After, and admitted again once one ends."""
    guard = StreamGuard(ProbeApp(max_concurrent=1), keepalive_interval=None)
    async with serve(guard, "sidecar") as bound:
        first = await request(bound, "GET", "/?events=2&interval_ms=1000")
        assert first.status == 200
        status, body = await get(bound, "events=1")
        assert status == 429 and body["error"]["code"] == "too_many_probes"  # type: ignore[index]
        await first.body()
        first.close()
        status, _ = await get(bound, "events=1")
        assert status == 200


async def test_the_guards_keepalives_fill_the_gap_only_when_asked(port: int) -> None:
    """Rule: with keepalive=1 the guard writes `: keep-alive` comments during the silence (its
    interval, 0.3 s, is shorter than the 1 s gap); with keepalive=0 the probe holds a comment
    line open across the gap, so the guard writes none."""
    kept = await read(Target.from_url(f"http://127.0.0.1:{port}"), Shape(2, 10, 0, 1.0, True))
    bare = await read(Target.from_url(f"http://127.0.0.1:{port}"), Shape(2, 10, 0, 1.0, False))
    assert kept.complete and bare.complete
    assert len([c for c in kept.comments if c[1] == "keep-alive"]) >= 2
    assert [c for c in bare.comments if c[1] == "keep-alive"] == []
    assert kept.announced["keepalive_interval"] == 0.3


@pytest.mark.parametrize("http2", [False, True])
async def test_the_sidecar_directly_passes_every_check(http2: bool) -> None:
    """Rule: read straight from the sidecar, over HTTP/1.1 and over h2c, the probe finds
    nothing: events one by one, no compression, keep-alives, no cut."""
    guard = sidecar("--keepalive-interval", "0.3")
    server = "hypercorn" if http2 else "sidecar"
    async with serve(guard, server) as bound:
        target = Target.from_url(f"http://127.0.0.1:{bound}/", http2=http2)
        plain = await read(target, Shape(10, 50, 128, 1.0, False))
        kept = await read(target, Shape(2, 50, 0, 1.0, True))
    assert plain.http_version == ("2" if http2 else "1.1")
    statuses = {c.name: c.status for c in checks(plain, kept)}
    assert set(statuses.values()) == {Status.OK}, statuses


async def test_each_event_carries_its_index_and_send_time(port: int) -> None:
    """Rule: ticks are numbered in order and their send times follow `interval_ms`."""
    timeline = await read(Target.from_url(f"http://127.0.0.1:{port}"), Shape(5, 40, 16))
    assert [e.index for e in timeline.events] == list(range(5))
    sent = [e.sent for e in timeline.events]
    assert all(0.03 <= b - a <= 0.2 for a, b in itertools.pairwise(sent))


def test_usage_and_connection_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Rule: a bad flag value or a path with no probe behind it is exit status 2, one line."""
    from sidecar.cli import main

    assert main(["probe", "http://127.0.0.1:1", "--events", "0"]) == 2
    assert main(["probe", "http://127.0.0.1:1"]) == 2
    assert "cannot connect" in capsys.readouterr().err


async def test_the_probes_cpu_is_bounded_like_any_relayed_stream() -> None:
    """The bounds hold as CPU, not only as parameters: the most a client may ask — the
    concurrency cap of probes at the event and byte caps, no interval — costs the sidecar no
    more CPU per event than relaying the same number of events from the emulator through the
    proxy (measured side by side in this process, a ratio, not a time), and a probe past the
    cap is refused at once."""
    import asyncio
    import time

    from middleware.probe import MAX_BYTES, MAX_CONCURRENT
    from sidecar.emulator import Stats, make_app

    events = 1000
    pad = MAX_BYTES // events

    async def drain(port: int, method: str, path: str, body: bytes = b"") -> int:
        response = await request(port, method, path, body=body)
        data = await response.body()
        response.close()
        assert response.status == 200
        return data.count(b"\n\n")  # events (and a few comments) ended

    async with serve(make_app(stats=Stats())) as up:
        settings = load(["--upstream", f"http://127.0.0.1:{up}"], environ={})
        async with serve(build_guard(settings, StreamRegistry()), "sidecar") as port:
            query = f"/sidestream/v1/probe?events={events}&interval_ms=0&pad={pad}"
            start = time.process_time()
            probed = await asyncio.gather(
                *(drain(port, "GET", query) for _ in range(MAX_CONCURRENT))
            )
            probe_cpu = time.process_time() - start
            chat = {
                "model": "m",
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
                "sidestream": {"tokens": events, "itl_ms": 1, "ttft_ms": 0},  # a write each
            }
            start = time.process_time()
            relayed = await asyncio.gather(
                *(
                    drain(port, "POST", "/v1/chat/completions", json.dumps(chat).encode())
                    for _ in range(MAX_CONCURRENT)
                )
            )
            relay_cpu = time.process_time() - start
    assert min(probed) >= events and min(relayed) >= events
    # The relay's CPU includes the emulator's (same process); the probe's includes making
    # its events. A probe event may cost up to twice a relayed one.
    assert probe_cpu / sum(probed) <= 2 * relay_cpu / sum(relayed), (probe_cpu, relay_cpu)


@pytest.mark.parametrize("url", ["/sidestream/v1/probe", "/sidestream/v1/probe/", "/"])
async def test_the_probe_mounted_in_a_starlette_app_is_read_as_docs_probe_md_shows(
    url: str,
) -> None:
    """`Mount("/sidestream/v1/probe", ProbeApp(...))` inside StreamGuard, as docs/probe.md
    shows: Starlette answers the path without the slash with a 307 to the path with it; the
    client follows that one same-origin redirect, and the probe passes every check whether the
    user gave the probe's path, with or without its slash, or the app's base URL."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    # as the doc's line, with an interval the probe's short gap can show
    app = Starlette(routes=[Mount("/sidestream/v1/probe", ProbeApp(keepalive_interval=0.2))])
    guard = StreamGuard(app, keepalive_interval=0.2)
    async with serve(guard) as port:
        target = Target.from_url(f"http://127.0.0.1:{port}{url}")
        plain = await read(target, Shape(6, 20, 64, 0.5, False))
        kept = await read(target, Shape(2, 20, 0, 0.5, True))
    assert plain.status == 200 and plain.complete
    statuses = {c.name: c.status for c in checks(plain, kept)}
    assert set(statuses.values()) == {Status.OK}, statuses


async def test_a_redirect_to_another_origin_is_reported_not_followed() -> None:
    """The probe measures one path: a redirect to another host is a clear ProbeError."""
    from sidecar.probe.client import ProbeError

    async def moved(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
        headers = [(b"location", b"http://other.example/sidestream/v1/probe/")]
        await send({"type": "http.response.start", "status": 307, "headers": headers})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

    async with serve(moved) as port:
        with pytest.raises(ProbeError, match="another origin"):
            await read(Target.from_url(f"http://127.0.0.1:{port}"), Shape(events=2))
