"""A tiny OTLP/HTTP sink: answers 200 to every POST (/v1/traces, /v1/metrics, /v1/logs).

`python -m bench.sink PORT`. `GET /count` returns how many exports arrived per path, so the
harness can tell "telemetry on" from "telemetry not wired" without trusting either side.
Raw asyncio protocol with keep-alive; bodies are counted and dropped.
"""

from __future__ import annotations

import asyncio
import json
import sys

import uvloop

counts: dict[str, int] = {}
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"


class Sink(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            method, path = head.split(" ", 2)[:2]
            assert self.transport is not None
            if method == "GET":
                body = json.dumps(counts).encode()
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                self.transport.close()  # the harness's GET says `Connection: close`
                return
            else:
                counts[path] = counts.get(path, 0) + 1
                self.transport.write(OK)


async def serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Sink, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1])))
