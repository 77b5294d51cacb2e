"""Every request has an honest outcome, in its answer, its access line and its metric:
the upstream's own 5xx is `upstream_error` (its `error.type` the status), a 429 is
`rate_limited`, a connect timeout `upstream_error` with a 504, a refusal by `--max-streams`
`rejected_overload`, by a drain `rejected_draining`; a client dropped by `--send-timeout` is
`slow_client`, with one line of sidestream's own and no error logged by uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Sum

from middleware.guard import StreamGuard
from middleware.registry import StreamRegistry
from middleware.telemetry import Telemetry, semconv
from sidecar.app import build_guard
from sidecar.config import load
from tests.support.apps import Probe, scripted
from tests.support.clients import request
from tests.support.faulty import FaultyUpstream
from tests.support.servers import serve

CHAT = "/v1/chat/completions"
BODY = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'


Lines = Callable[[], list[dict[str, Any]]]


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Lines:
    """The access lines logged so far, parsed."""
    caplog.set_level("INFO", logger=semconv.ACCESS_LOGGER)
    return lambda: [
        json.loads(r.getMessage()) for r in caplog.records if r.name == semconv.ACCESS_LOGGER
    ]


def streams_by_outcome(telemetry: Telemetry) -> dict[str, int]:
    """The streams counter's points: outcome -> count."""
    (metric,) = [m for m in telemetry.metrics() if m.name == semconv.METRIC_STREAMS]
    assert isinstance(metric.data, Sum)
    counts: dict[str, int] = {}
    for point in metric.data.data_points:
        outcome = str(dict(point.attributes or {})[semconv.OUTCOME])
        counts[outcome] = counts.get(outcome, 0) + int(point.value)
    return counts


def errors_by_type(telemetry: Telemetry) -> set[str]:
    """The `error.type` values on the operation-duration histogram's points."""
    (metric,) = [m for m in telemetry.metrics() if m.name == semconv.METRIC_OPERATION_DURATION]
    return {
        str(dict(p.attributes or {}).get(semconv.ERROR_TYPE))
        for p in metric.data.data_points  # type: ignore[union-attr]
        if semconv.ERROR_TYPE in dict(p.attributes or {})
    }


@contextlib.asynccontextmanager
async def sidecar(upstream: int, *flags: str) -> AsyncIterator[tuple[int, Telemetry, Any]]:
    telemetry = Telemetry(metric_readers=[InMemoryMetricReader()])
    settings = load(["--upstream", f"http://127.0.0.1:{upstream}", *flags], environ={})
    guard = build_guard(settings, StreamRegistry(), telemetry)
    async with serve(guard, "sidecar") as port:
        yield port, telemetry, guard


async def post(port: int, **headers: str) -> tuple[int, bytes]:
    hdrs = [("Content-Type", "application/json"), *headers.items()]
    response = await request(port, "POST", CHAT, body=BODY, headers=hdrs)
    try:
        body = await response.body()
    finally:
        response.close()
    return response.status, body


@pytest.mark.parametrize(
    ("fault", "status", "outcome", "error_type"),
    [("500", 500, "upstream_error", "500"), ("429", 429, "rate_limited", None)],
)
async def test_the_upstreams_own_errors_count_as_what_they_are(
    lines: Lines, fault: str, status: int, outcome: str, error_type: str | None
) -> None:
    """A 5xx passed through is `upstream_error` with `error.type` its status; a 429 is
    `rate_limited` (no error type: the request was refused, nothing broke). Neither is
    `completed`."""
    async with FaultyUpstream() as upstream, sidecar(upstream.port) as (port, telemetry, _):
        got, _ = await post(port, **{"X-Fault": fault})
        await asyncio.sleep(0)  # the record is finished as the request's task ends
    assert got == status
    assert streams_by_outcome(telemetry) == {outcome: 1}
    assert errors_by_type(telemetry) == ({error_type} if error_type else set())
    (line,) = lines()
    assert line["outcome"] == outcome and line["status"] == status


async def test_a_connect_timeout_is_an_upstream_error_answered_504(
    lines: Lines,
) -> None:
    """A connect that times out answers 504 `upstream_timeout` and counts as
    `upstream_error`. The upstream is a backlog-0 listener whose queue is full."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    try:
        for _ in range(8):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(listener.getsockname())
            fillers.append(filler)
        upstream = listener.getsockname()[1]
        async with sidecar(upstream, "--connect-timeout", "0.3") as (port, telemetry, _):
            status, body = await post(port)
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
    assert status == 504 and json.loads(body)["error"]["code"] == "upstream_timeout"
    assert streams_by_outcome(telemetry) == {"upstream_error": 1}
    (line,) = lines()
    assert line["outcome"] == "upstream_error" and line["status"] == 504


async def test_refusals_by_max_streams_and_by_drain_are_reported(
    lines: Lines,
) -> None:
    """A request refused at admission gets its 503 and is counted: `rejected_overload` past
    `max_streams`, `rejected_draining` during a drain, each with an access line and a
    metric, and the error type saying which."""
    probe = Probe()
    app = scripted([(0, b"data: {}\n\n"), (30, b"data: [DONE]\n\n")], probe)
    telemetry = Telemetry(metric_readers=[InMemoryMetricReader()])
    registry = StreamRegistry()
    guard = StreamGuard(app, max_streams=1, registry=registry, telemetry=telemetry)
    async with serve(guard) as port:
        held = await request(port, "POST", CHAT, body=BODY)
        await held.chunk()  # one stream in flight: the limit is reached
        over, _ = await post(port)
        registry.draining = True
        draining, _ = await post(port)
        held.close()
        await probe.wait(5)
    assert over == 503 and draining == 503
    counts = streams_by_outcome(telemetry)
    assert counts["rejected_overload"] == 1 and counts["rejected_draining"] == 1
    assert errors_by_type(telemetry) >= {"rejected_overload", "rejected_draining"}
    refused = [line for line in lines() if line["outcome"].startswith("rejected")]
    assert sorted(line["outcome"] for line in refused) == ["rejected_draining", "rejected_overload"]
    assert all(line["status"] == 503 and line["stream"] is False for line in refused)


async def test_a_dropped_slow_client_is_one_info_line_not_a_server_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that accepts nothing for send_timeout is dropped with outcome `slow_client`
    and one info line of sidestream's; uvicorn logs nothing about a response left
    incomplete (the sidecar's server offers `abort`)."""
    caplog.set_level("INFO")
    server_errors: list[logging.LogRecord] = []
    uvicorn_log = logging.getLogger("uvicorn.error")  # uvicorn's loggers do not reach root
    catcher = logging.Handler(logging.ERROR)
    catcher.emit = server_errors.append  # type: ignore[method-assign]
    probe = Probe()
    piece = b"data: " + b"y" * 65530 + b"\n\n"
    telemetry = Telemetry(metric_readers=[InMemoryMetricReader()])
    guard = StreamGuard(scripted([(0, piece)] * 2000, probe), send_timeout=0.3, telemetry=telemetry)
    try:
        async with serve(guard, "sidecar") as port:
            uvicorn_log.addHandler(catcher)  # after the server set up uvicorn's logging
            response = await request(port, "POST", CHAT, body=BODY)
            await probe.wait(10)
            await asyncio.sleep(0.05)  # the server's own end of the request, after the app's
            response.close()
    finally:
        uvicorn_log.removeHandler(catcher)
    assert [r.getMessage() for r in server_errors] == []
    assert streams_by_outcome(telemetry) == {"slow_client": 1}
    dropped = [r for r in caplog.records if "dropped a slow client" in r.getMessage()]
    assert len(dropped) == 1 and dropped[0].levelno == logging.INFO
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
    ]
