"""The load generator: asyncio + uvloop on raw sockets, one worker process per invocation.

`python -m bench.loadgen '<json config>'` prints one JSON result line. The harness starts
several of these (pinned to the load core) with a shared `start_at` so they begin together.

Each stream is a fresh TCP connection sending one `POST /v1/chat/completions` with the
emulator's pacing headers. The response is decoded just enough: status line, chunked
framing, then SSE events split on a blank line. A content token is an event with
`"delta":{"content":`; its send time (CLOCK_MONOTONIC ns, same machine: the emulator's
stamp, config `"stamp"`: `"content"` as the token's text, `"tail"` or true as a
`"sidestream_sent_ns"` field after the choices) gives the one-way latency of that token.
Deliberately no HTTP library: the generator must cost far less per token than anything it
measures.

Modes: "streams" runs `concurrency` lanes, each opening streams back to back until
`streams` are done or `duration` passes (to `port`, or to each of `ports` in turn:
`bench.ttft` interleaves targets so); "hold" opens `concurrency` streams at `rate` per
second and keeps them open until at least `hold_s` after the last one opened (longer, up to
`max_hold_s`, until every open stream got its second token), then reports which are still
open and flowing (at least two content tokens).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import time
from typing import Any, cast

import uvloop

CONTENT = b'"delta":{"content":'
# Where each stamp mode puts the send time: the bytes before the number and the one after it.
STAMPS = {"content": (CONTENT + b'"', b'"'), "tail": (b'"sidestream_sent_ns":', b"}")}
DONE = b"data: [DONE]"
BODY = b'{"model":"emulator","messages":[{"role":"user","content":"hi"}],"stream":true}'


def request(host: str, port: int, cfg: dict[str, Any]) -> bytes:
    mode = _stamp_mode(cfg)
    stamp = b"X-Emulator-Stamp: %s\r\n" % mode.encode() if mode else b""
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\n"
        b"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        b"X-Emulator-TTFT-Ms: %s\r\nX-Emulator-ITL-Ms: %s\r\nX-Emulator-Tokens: %d\r\n"
        b"%sContent-Length: %d\r\n\r\n%s"
        % (
            host.encode(),
            port,
            str(cfg.get("ttft_ms", 0)).encode(),
            str(cfg.get("itl_ms", 0)).encode(),
            cfg["tokens"],
            stamp,
            len(BODY),
            BODY,
        )
    )


def _stamp_mode(cfg: dict[str, Any]) -> str | None:
    """The config's stamp mode: "content", "tail" (also for true), or None."""
    stamp = cfg.get("stamp")
    return "tail" if stamp is True else stamp or None


class Chunked:
    """Minimal `Transfer-Encoding: chunked` decoder; `done` after the last chunk."""

    __slots__ = ("buf", "done", "remaining", "skip")

    def __init__(self) -> None:
        self.buf = b""
        self.remaining = 0
        self.skip = 0
        self.done = False

    def feed(self, data: bytes) -> bytes:
        buf = self.buf + data if self.buf else data
        pos, n, out = 0, len(buf), []
        while pos < n and not self.done:
            if self.remaining:
                take = min(self.remaining, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self.remaining -= take
                if not self.remaining:
                    self.skip = 2
            elif self.skip:
                take = min(self.skip, n - pos)
                pos += take
                self.skip -= take
            else:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                size = int(buf[pos:eol].split(b";", 1)[0], 16)
                pos = eol + 2
                if size == 0:
                    self.done = True
                else:
                    self.remaining = size
        self.buf = buf[pos:]
        return out[0] if len(out) == 1 else b"".join(out)


class Stream(asyncio.Protocol):
    """One request/response on its own connection; `done` resolves when it ends."""

    def __init__(
        self, req: bytes, close_after: int | None, lat: list[int] | None, stamp: str | None
    ) -> None:
        self.req = req
        self.close_after = close_after
        self.lat = lat
        self.stamp_at, self.stamp_end = STAMPS[stamp] if stamp else (b"", b"")
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.t0 = time.monotonic_ns()
        self.first_ns = 0
        self.tokens = 0
        self.nbytes = 0
        self.head = b""
        self.in_body = False
        self.chunked: Chunked | None = None
        self.pending = b""
        self.saw_done = False
        self.completed = False
        self.cancelled_at = 0.0
        self.error = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.transport.write(self.req)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        self.nbytes += len(data)
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data, self.head = self.head[:end], self.head[end + 4 :], b""
            if not head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
                self._finish(f"status {head[:12].decode('latin-1')!r}")
                return
            self.in_body = True
            if b"chunked" in head.lower():
                self.chunked = Chunked()
        payload = self.chunked.feed(data) if self.chunked is not None else data
        if payload:
            self._events(payload, now)
        if self.done.done():
            return
        if (self.chunked is not None and self.chunked.done) or (
            self.chunked is None and self.saw_done
        ):
            self.completed = self.saw_done
            self._finish("" if self.saw_done else "ended without [DONE]")

    def _events(self, payload: bytes, now: int) -> None:
        buf = self.pending + payload if self.pending else payload
        parts = buf.split(b"\n\n")
        self.pending = parts.pop()
        for event in parts:
            if CONTENT in event:
                self.tokens += 1
                if not self.first_ns:
                    self.first_ns = now
                if self.lat is not None:
                    i = event.find(self.stamp_at)
                    if i >= 0:
                        i += len(self.stamp_at)
                        self.lat.append(now - int(event[i : event.index(self.stamp_end, i)]))
                if self.close_after is not None and self.tokens >= self.close_after:
                    self.cancelled_at = time.monotonic()
                    self._finish("")
                    return
            elif event.startswith(DONE):
                self.saw_done = True

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.completed = self.saw_done
            self._finish("" if self.saw_done else f"closed early ({exc or 'EOF'})")

    def _finish(self, error: str) -> None:
        self.error = error
        if self.transport is not None:
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)

    def record(self) -> list[Any]:
        ttft = (self.first_ns - self.t0) if self.first_ns else -1
        return [ttft, self.tokens, self.nbytes, int(self.completed), self.cancelled_at, self.error]


async def open_stream(
    host: str,
    port: int,
    req: bytes,
    close_after: int | None,
    lat: list[int] | None,
    stamp: str | None = None,
) -> Stream:
    loop = asyncio.get_running_loop()
    stream = Stream(req, close_after, lat, stamp)
    try:
        await loop.create_connection(lambda: stream, host, port)
    except OSError as exc:
        stream._finish(f"connect: {exc}")
    return stream


async def run_streams(cfg: dict[str, Any]) -> dict[str, Any]:
    host = cfg.get("host", "127.0.0.1")
    # `ports`: the streams go to each in turn (stream i to ports[i % n]), so that targets
    # measured together meet the machine's moments alike; each record ends with its port.
    ports = cfg.get("ports") or [cfg["port"]]
    reqs = [request(host, port, cfg) for port in ports]
    opened = [0]
    stamp = _stamp_mode(cfg)
    lat: list[int] | None = [] if stamp else None
    records: list[list[Any]] = []
    budget = [cfg.get("streams") or 1 << 60]
    deadline = time.monotonic() + cfg["duration"] if cfg.get("duration") else float("inf")
    close_after = cfg.get("close_after")
    streams_now: set[Stream] = set()

    async def lane(delay: float) -> None:
        await asyncio.sleep(delay)
        while budget[0] > 0 and time.monotonic() < deadline:
            budget[0] -= 1
            turn = opened[0] % len(ports)
            opened[0] += 1
            stream = await open_stream(host, ports[turn], reqs[turn], close_after, lat, stamp)
            streams_now.add(stream)
            timeout = deadline - time.monotonic() if deadline != float("inf") else None
            try:
                await asyncio.wait_for(asyncio.shield(stream.done), timeout)
            except TimeoutError:
                stream._finish("cut at deadline")
            streams_now.discard(stream)
            records.append(stream.record() + ([ports[turn]] if len(ports) > 1 else []))

    lanes, stagger = cfg["concurrency"], cfg.get("stagger_s", 0.0)
    await asyncio.gather(*(lane(stagger * i / lanes) for i in range(lanes)))
    return {"streams": records, "latencies_ns": lat or []}


async def run_hold(cfg: dict[str, Any]) -> dict[str, Any]:
    host, port = cfg.get("host", "127.0.0.1"), cfg["port"]
    req = request(host, port, cfg)
    n, rate = cfg["concurrency"], cfg["rate"]
    start = time.monotonic()
    streams: list[Stream] = []
    for i in range(n):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        streams.append(await open_stream(host, port, req, None, None))
    opened = time.monotonic()
    await asyncio.sleep(cfg["hold_s"])
    give_up = opened + cfg.get("max_hold_s", 20.0)
    while time.monotonic() < give_up:
        if all(s.done.done() or s.tokens >= 2 for s in streams):
            break
        await asyncio.sleep(0.1)
    open_now = [s for s in streams if not s.done.done()]
    flowing = [s for s in open_now if s.tokens >= 2]
    errors: dict[str, int] = {}
    for s in streams:
        if s.done.done():
            errors[s.error[:80]] = errors.get(s.error[:80], 0) + 1
        s._finish("")
    return {
        "opened": n,
        "ramp_s": opened - start,
        "all_flowing_s": time.monotonic() - start,
        "open": len(open_now),
        "flowing": len(flowing),
        "errors": errors,
    }


async def main_async(cfg: dict[str, Any]) -> dict[str, Any]:
    delay = cfg.get("start_at", 0.0) - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    if cfg.get("mode") == "hold":
        return await run_hold(cfg)
    return await run_streams(cfg)


def main() -> int:
    cfg = json.loads(sys.argv[1])
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = uvloop.run(main_async(cfg))
    # After the loop a write to the pipe may return after 64 KB even with the descriptor
    # made blocking again (`write` returned 65536 of 300001 bytes under strace), and
    # sys.stdout does not retry: the harness, reading late, got a cut-off result. Loop.
    fd = sys.stdout.fileno()
    os.set_blocking(fd, True)
    rest = memoryview((json.dumps(result) + "\n").encode())
    while rest:
        rest = rest[os.write(fd, rest) :]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
