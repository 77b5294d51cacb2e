"""The probe's origin: a synthetic, bounded SSE stream whose shape the query sets.

`ProbeApp` is a small ASGI app. The sidecar serves it at `/sidestream/v1/probe`, inside
StreamGuard and before the proxy, so the upstream is never contacted; in middleware mode,
mount it inside the app StreamGuard wraps (e.g. Starlette's `Mount(PROBE_PATH, ProbeApp())`).
`sidestream probe URL` reads it through whatever stands in front and compares what it sent
(each event carries its index and send time) with what arrived.

The stream: one `start` event (the shape, and the guard's keep-alive interval when known),
`events` `tick` events `interval_ms` apart, each `pad` bytes of padding, one silence of
`gap_s` seconds after the first half, then one `end` event.

Deliberate choices (do not "fix" these):

- The probe never writes keep-alives itself: the ones that matter are the guard's, at the
  interval the deployment runs with. `keepalive=1` leaves the silence to the guard, which
  fills it with `: keep-alive` comments every `--keepalive-interval` (so they appear only
  when that interval is shorter than the gap). `keepalive=0` opens a comment line before the
  silence and ends it after: the guard never writes a keep-alive mid-line, so the silence
  stays bare and measures the path's own idle timeout.
- Every parameter has a hard bound, and so do the whole stream's duration and bytes, and the
  number of probes at once (429 past it): the probe is reachable wherever the stream is.
"""

from __future__ import annotations

import asyncio
import json
import random
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from time import monotonic

from middleware.stream_response import error_response
from middleware.types import Receive, Scope, Send

PROBE_PATH = "/sidestream/v1/probe"


@dataclass(frozen=True, slots=True)
class Bound:
    """One query parameter: its inclusive range and its default."""

    low: float
    high: float
    default: float
    whole: bool = True  # a whole number; else a decimal is allowed


BOUNDS = {
    "events": Bound(1, 1000, 20),
    "interval_ms": Bound(0, 10_000, 100),
    "pad": Bound(0, 16_384, 256),
    "gap_s": Bound(0, 100, 0, whole=False),
    "keepalive": Bound(0, 1, 0),
}
MAX_SECONDS = 180  # events * interval_ms + gap_s
MAX_BYTES = 2 * 1024 * 1024  # events * pad
MAX_CONCURRENT = 8  # probes in flight per ProbeApp; past it 429

# Padding is taken from a fixed random text, walking through it so no event repeats a stretch
# of the last 32 KiB (deflate's window): a compressing hop shrinks it by its entropy only, so
# its buffers fill the way real tokens fill them. Made once; slicing costs no CPU per byte.
_POOL = 128 * 1024
_PAD = "".join(random.Random(29).choices("abcdefghijklmnopqrstuvwxyz0123456789", k=_POOL))
_PAD += _PAD[:16_384]


class BadParameter(ValueError):
    """A query parameter is malformed, unknown, or out of its bounds."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _bounds_text(name: str) -> str:
    b = BOUNDS[name]
    return f"{b.low:g} to {b.high:g}"


@dataclass(frozen=True, slots=True)
class Shape:
    """What the query asked for, checked against the bounds."""

    events: int = 20
    interval_ms: int = 100
    pad: int = 256
    gap_s: float = 0.0
    keepalive: bool = False

    @classmethod
    def parse(cls, query: bytes | str) -> Shape:
        """The shape from a query string, or BadParameter naming the first bad parameter."""
        if isinstance(query, bytes):
            query = query.decode("latin-1")
        try:
            pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=False)
        except ValueError as exc:  # pragma: no cover - parse_qsl is lenient
            raise BadParameter("query", f"malformed query: {exc}") from None
        values: dict[str, float] = {}
        for name, raw in pairs:
            bound = BOUNDS.get(name)
            if bound is None:
                known = ", ".join(BOUNDS)
                raise BadParameter(name, f"unknown parameter {name!r}; known: {known}")
            if name in values:
                raise BadParameter(name, f"{name} is given more than once")
            values[name] = _number(name, raw, bound)
        shape = cls(
            events=int(values.get("events", BOUNDS["events"].default)),
            interval_ms=int(values.get("interval_ms", BOUNDS["interval_ms"].default)),
            pad=int(values.get("pad", BOUNDS["pad"].default)),
            gap_s=float(values.get("gap_s", BOUNDS["gap_s"].default)),
            keepalive=bool(values.get("keepalive", 0)),
        )
        if shape.duration > MAX_SECONDS:
            raise BadParameter(
                "gap_s",
                f"events * interval_ms + gap_s is {shape.duration:g} s; at most {MAX_SECONDS} s",
            )
        if shape.events * shape.pad > MAX_BYTES:
            raise BadParameter(
                "pad", f"events * pad is {shape.events * shape.pad} bytes; at most {MAX_BYTES}"
            )
        return shape

    @property
    def duration(self) -> float:
        return self.events * self.interval_ms / 1000 + self.gap_s

    @property
    def gap_after(self) -> int:
        """The index of the tick the silence follows (the first half's last)."""
        return (self.events - 1) // 2

    def query(self) -> str:
        return urllib.parse.urlencode(
            {
                "events": self.events,
                "interval_ms": self.interval_ms,
                "pad": self.pad,
                "gap_s": f"{self.gap_s:g}",
                "keepalive": int(self.keepalive),
            }
        )


def _number(name: str, raw: str, bound: Bound) -> float:
    try:
        value = int(raw) if bound.whole else float(raw)
    except ValueError:
        kind = "a whole number" if bound.whole else "a number"
        raise BadParameter(
            name, f"{name} must be {kind} from {_bounds_text(name)}, got {raw!r}"
        ) from None
    if not bound.low <= value <= bound.high:  # also refuses nan
        raise BadParameter(name, f"{name} must be from {_bounds_text(name)}, got {raw!r}")
    return value


def tick(index: int, sent: float, pad: int) -> bytes:
    """One tick event: its index, its send time (seconds since the stream began), padding."""
    start = index * pad % _POOL
    data = f'{{"i":{index},"t":{sent:.6f},"pad":"{_PAD[start : start + pad]}"}}'
    return f"id: {index}\nevent: tick\ndata: {data}\n\n".encode()


def _event(kind: str, payload: Mapping[str, object]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def _json(
    send: Send, status: int, error: dict[str, str], extra: list[tuple[bytes, bytes]]
) -> None:
    body = json.dumps({"error": error}, separators=(",", ":")).encode()
    start, end = error_response(status, body, extra=extra)
    await send(start)
    await send(end)


async def refuse(send: Send, status: int, code: str, message: str, **extra: str) -> None:
    """A JSON error in the sidecar's shape: `{"error": {"message", "type", "code"}}`."""
    error = {"message": message, "type": "invalid_request_error", "code": code, **extra}
    headers = [(b"retry-after", b"1")] if status == 429 else []
    if status == 405:
        headers.append((b"allow", b"GET, HEAD"))
    await _json(send, status, error, headers)


class ProbeApp:
    """The probe stream as an ASGI app (HTTP only). Holds configuration and the count of
    probes in flight; each probe's state is its coroutine's locals.

    `keepalive_interval` is the guard's, announced in the `start` event so the client can
    tell a hop that drops comments from an interval longer than the gap.
    """

    def __init__(
        self, *, keepalive_interval: float | None = None, max_concurrent: int = MAX_CONCURRENT
    ) -> None:
        self.keepalive_interval = keepalive_interval
        self.max_concurrent = max_concurrent
        self.active = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] not in ("GET", "HEAD"):
            await refuse(send, 405, "method_not_allowed", "the probe answers GET only")
            return
        try:
            shape = Shape.parse(scope.get("query_string", b""))
        except BadParameter as exc:
            await refuse(send, 400, "bad_probe_parameter", str(exc), param=exc.param)
            return
        if self.active >= self.max_concurrent:
            message = f"{self.max_concurrent} probes are running; retry shortly"
            await refuse(send, 429, "too_many_probes", message)
            return
        self.active += 1
        try:
            await self._stream(shape, scope["method"] == "HEAD", send)
        finally:
            self.active -= 1

    async def _stream(self, shape: Shape, head: bool, send: Send) -> None:
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if head:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        began = monotonic()
        announce = {
            "events": shape.events,
            "interval_ms": shape.interval_ms,
            "pad": shape.pad,
            "gap_s": shape.gap_s,
            "keepalive": int(shape.keepalive),
            "keepalive_interval": self.keepalive_interval,
        }
        body = {"type": "http.response.body", "more_body": True}
        await send({**body, "body": _event("start", announce)})
        interval, total = shape.interval_ms / 1000, 0
        due = began
        for index in range(shape.events):
            if index:
                due += interval
            delay = due - monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            data = tick(index, monotonic() - began, shape.pad)
            total += len(data)
            await send({**body, "body": data})
            if index == shape.gap_after and shape.gap_s > 0:
                due = await self._silence(shape, send)
        await send({**body, "body": _event("end", {"events": shape.events, "bytes": total})})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _silence(shape: Shape, send: Send) -> float:
        """The gap. Without keep-alives a comment line stays open across it (the guard writes
        keep-alives only at a line boundary); with them it is closed first. Returns the time
        the next tick is due."""
        opener = f": silence {shape.gap_s:g} s".encode()
        body = {"type": "http.response.body", "more_body": True}
        await send({**body, "body": opener if not shape.keepalive else opener + b"\n"})
        await asyncio.sleep(shape.gap_s)
        if not shape.keepalive:
            await send({**body, "body": b"\n"})
        return monotonic()
