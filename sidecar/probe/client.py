"""Read one probe stream and record when each byte came: the I/O half of `sidestream probe`.

httpcore (a runtime dependency already) speaks HTTP/1.1, h2 over TLS by ALPN and h2c with
prior knowledge, and hands back each read as it arrives, so a hop's bunching shows in the
read times. The request asks `Accept-Encoding: gzip, deflate, br`, as a browser does: a hop
compresses only for clients that accept it. gzip and deflate are decoded here to read the
events; br is reported, not decoded.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.parse
import zlib
from dataclasses import dataclass, replace
from time import monotonic

import httpcore

from middleware.probe import PROBE_PATH, Shape
from sidecar.probe.analysis import Event, Timeline

ACCEPT_ENCODING = b"gzip, deflate, br"
READ_MARGIN_S = 15.0  # past the stream's own duration, how long a held stream may take
CONNECT_TIMEOUT_S = 10.0


class ProbeError(Exception):
    """The probe could not run: no connection, or the probe answered with an error status."""


@dataclass(frozen=True)
class Target:
    url: str  # the probe URL, without query
    http2: bool = False  # h2c with prior knowledge on http://, h2 only on https://
    insecure: bool = False

    @classmethod
    def from_url(cls, url: str, *, http2: bool = False, insecure: bool = False) -> Target:
        """A base URL gets the probe path appended (after any prefix an ingress routes)."""
        if not url.startswith(("http://", "https://")):
            raise ProbeError(f"expected an http:// or https:// URL, got {url!r}")
        base = url.split("?", 1)[0].split("#", 1)[0]
        scheme, _, rest = base.partition("://")
        host, slash, path = rest.partition("/")
        path = slash + path
        if not path.rstrip("/").endswith(PROBE_PATH):
            path = path.rstrip("/") + PROBE_PATH
        return cls(f"{scheme}://{host}{path.rstrip('/')}", http2, insecure)

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def pool(self) -> httpcore.AsyncConnectionPool:
        tls = self.url.startswith("https://")
        return httpcore.AsyncConnectionPool(
            ssl_context=self.ssl_context() if tls else None,
            http1=not self.http2,
            http2=self.http2 or tls,
        )


class Decoder:
    """The body as the origin wrote it, from what arrived (gzip/deflate undone)."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self._zlib: zlib._Decompress | None = None
        self.undecodable = False
        if encoding in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS | 16)
        elif encoding == "deflate":
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS)
        elif encoding not in ("", "identity"):
            self.undecodable = True

    def decode(self, data: bytes) -> bytes:
        if self.undecodable:
            return b""
        if self._zlib is None:
            return data
        try:
            return self._zlib.decompress(data)
        except zlib.error:
            if self.encoding != "deflate":
                raise
            self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate, as some servers send
            self.encoding = "raw deflate"
            return self._zlib.decompress(data)


class EventReader:
    """An incremental SSE reader that notes, per event, the read that completed it."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self._buffer = b""
        self._kind = ""
        self._data: list[str] = []
        self._size = 0

    def feed(self, data: bytes, at: float) -> None:
        self._buffer += data
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                if self._buffer.startswith(b": silence") and self.timeline.silence_at is None:
                    self.timeline.silence_at = at  # the line held open across the gap
                return
            line, self._buffer = self._buffer[:end], self._buffer[end + 1 :]
            self._size += end + 1
            self._line(line.rstrip(b"\r").decode("utf-8", "replace"), at)

    def _line(self, line: str, at: float) -> None:
        t = self.timeline
        if not line:
            if self._data or self._kind:
                self._dispatch(self._kind or "message", "\n".join(self._data), at)
            self._kind, self._data, self._size = "", [], 0
            return
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if not name:
            t.comments.append((at, value))
            if value.startswith("silence") and t.silence_at is None:
                t.silence_at = at
            self._size = 0
        elif name == "event":
            self._kind = value
        elif name == "data":
            self._data.append(value)

    def _dispatch(self, kind: str, data: str, at: float) -> None:
        t = self.timeline
        try:
            payload = json.loads(data)
        except ValueError:
            return
        if not isinstance(payload, dict):
            return
        if kind == "tick":
            t.events.append(Event(int(payload["i"]), float(payload["t"]), at, self._size))
        elif kind == "start":
            t.announced = payload
        elif kind == "end":
            t.complete = True


class _Redirect(Exception):
    """The probe URL answered a redirect to `url` (same origin): read that one instead."""

    def __init__(self, url: str) -> None:
        self.url = url


REDIRECTS = frozenset({301, 302, 307, 308})


async def read(target: Target, shape: Shape) -> Timeline:
    """One probe stream, timed. Raises ProbeError when there is no probe stream to read.

    One redirect to the same origin is followed: a probe mounted in a Starlette app answers
    its path without the trailing slash with a 307 to the path with it. A redirect to another
    origin, or a second one, is reported, not followed (the probe measures one path)."""
    try:
        return await _read(target, shape)
    except _Redirect as redirect:
        try:
            return await _read(replace(target, url=redirect.url), shape)
        except _Redirect:
            raise ProbeError(f"the probe answered a second redirect, from {redirect.url}") from None


async def _read(target: Target, shape: Shape) -> Timeline:
    timeline = Timeline()
    url = f"{target.url}?{shape.query()}"
    headers = [(b"accept", b"text/event-stream"), (b"accept-encoding", ACCEPT_ENCODING)]
    timeouts = {
        "connect": CONNECT_TIMEOUT_S,
        "read": None,
        "write": CONNECT_TIMEOUT_S,
        "pool": None,
    }
    began = monotonic()
    try:
        async with (
            asyncio.timeout(shape.duration + READ_MARGIN_S),
            target.pool() as pool,
            pool.stream("GET", url, headers=headers, extensions={"timeout": timeouts}) as response,
        ):
            timeline.headers_at = monotonic() - began
            await _read_body(response, timeline, began, target.url)
    except TimeoutError:
        if timeline.headers_at is None:
            raise ProbeError(f"no response from {target.url} in time") from None
        timeline.error = f"no end after {shape.duration + READ_MARGIN_S:g} s"
        timeline.ended_at = monotonic() - began
    except (httpcore.ConnectError, httpcore.ConnectTimeout, OSError, ssl.SSLError) as exc:
        raise ProbeError(f"cannot connect to {target.url}: {exc or type(exc).__name__}") from None
    except httpcore.ProtocolError as exc:
        if timeline.headers_at is None:
            raise ProbeError(f"{target.url} broke the exchange: {exc}") from None
    return timeline


async def _read_body(
    response: httpcore.Response, timeline: Timeline, began: float, url: str
) -> None:
    timeline.status = response.status
    version = response.extensions.get("http_version", b"HTTP/1.1")
    timeline.http_version = version.decode().removeprefix("HTTP/")
    timeline.headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in response.headers]
    location = timeline.header("location")
    if response.status in REDIRECTS and location is not None:
        await response.aread()
        raise _Redirect(_same_origin(url, location))
    if response.status != 200:
        body = b"".join([part async for part in response.aiter_stream()])
        raise ProbeError(f"the probe answered {response.status}: {_message(body)}")
    decoder = Decoder((timeline.header("content-encoding") or "").strip().lower())
    timeline.undecodable = decoder.encoding if decoder.undecodable else None
    reader = EventReader(timeline)
    try:
        async for data in response.aiter_stream():
            at = monotonic() - began
            timeline.last_byte_at = at
            reader.feed(decoder.decode(data), at)
    except (httpcore.ReadError, httpcore.RemoteProtocolError, zlib.error) as exc:
        timeline.error = str(exc) or type(exc).__name__
    timeline.ended_at = monotonic() - began


def _same_origin(url: str, location: str) -> str:
    """`location` made absolute against `url`, without its query (the probe adds its own);
    ProbeError when it names another origin."""
    moved = urllib.parse.urljoin(url, location)
    here, there = urllib.parse.urlsplit(url), urllib.parse.urlsplit(moved)
    if (here.scheme, here.netloc) != (there.scheme, there.netloc):
        raise ProbeError(f"the probe answered a redirect to another origin: {moved}")
    return urllib.parse.urlunsplit((there.scheme, there.netloc, there.path, "", ""))


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace") or "(no body)"
