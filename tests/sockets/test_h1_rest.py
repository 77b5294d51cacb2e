"""The HTTP/1.1 upstream connection lets its response parser go between chunks of a
chunked body (`sidecar.upstream.h1`, `H1Connection.feed_data`): an open stream holds no
parser, and whatever comes after the rest is read as the first parser would have read it."""

from __future__ import annotations

import asyncio
import gc

import httptools
import pytest
import uvloop

from middleware.errors import UpstreamProtocolError
from sidecar.upstream.h1pool import H1Pool
from tests.support.upstreams import RawConnection, RawUpstream

GET_HEADERS = [(b"host", b"upstream")]
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def parsers_alive() -> int:
    return sum(isinstance(o, httptools.HttpResponseParser) for o in gc.get_objects())


async def open_streams_hold_no_parser(streams: int) -> None:
    go_on = asyncio.Event()

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        conn.writer.write(CHUNKED + b"5\r\nhello\r\n")
        await go_on.wait()
        conn.writer.write(b"1\r\n!\r\n0\r\n\r\n")
        await conn.wait_eof()

    gc.collect()
    before = parsers_alive()  # any a test before this one left to the collector
    async with RawUpstream(handler).running() as raw:
        pool = H1Pool("127.0.0.1", raw.port)
        exchanges = [pool.exchange(b"GET", b"/", GET_HEADERS) for _ in range(streams)]
        responses = [await exchange.__aenter__() for exchange in exchanges]
        assert [await anext(r.body) for r in responses] == [b"hello"] * streams
        assert parsers_alive() <= before  # none per open stream between chunks
        go_on.set()
        for exchange, response in zip(exchanges, responses, strict=True):
            assert [chunk async for chunk in response.body] == [b"!"]
            await exchange.__aexit__(None, None, None)
        assert pool.idle_count == streams  # each ended, kept alive and pooled
        await pool.aclose()


def test_open_chunked_streams_hold_no_parser_between_chunks() -> None:
    """Bound per open stream: no response parser is held by a chunked response that stands
    between chunks, on asyncio's loop and on uvloop; the streams still end and are reused."""
    asyncio.run(open_streams_hold_no_parser(20))
    uvloop.run(open_streams_hold_no_parser(20))


# What comes after a rest, one write each (each but the last carries body bytes, read before
# the next is written): the body, and whether the connection is pooled after.
AFTER_REST = {
    "chunk-cut-across-reads": (CHUNKED, [b"5\r\nwor", b"ld\r\n", b"0\r\n\r\n"], b"helloworld", 1),
    # A read that ends on a CRLF inside a chunk's data (SSE events end lines with CRLF too):
    # the chunk is not over, and the next read is its rest, not a size line.
    "chunk-cut-after-a-crlf-in-its-data": (
        CHUNKED,
        [b"d\r\ndata: x\r\n", b"\r\nab\r\n", b"0\r\n\r\n"],
        b"hellodata: x\r\n\r\nab",
        1,
    ),
    "size-line-cut": (CHUNKED, [b"3\r\nab", b"c\r\n1", b"\r\nd\r\n0\r\n\r\n"], b"helloabcd", 1),
    "token-and-end-in-one-read": (CHUNKED, [b"3\r\nabc\r\n0\r\n\r\n"], b"helloabc", 1),
    "end-alone": (CHUNKED, [b"3\r\nabc\r\n", b"0\r\n\r\n"], b"helloabc", 1),
    "trailers": (CHUNKED, [b"3\r\nabc\r\n0\r\nx-t: 1\r\n\r\n"], b"helloabc", 1),
    "extension": (CHUNKED, [b"3;x=1\r\nabc\r\n", b"0\r\n\r\n"], b"helloabc", 1),
    "connection-close": (
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n",
        [b"3\r\nabc\r\n", b"0\r\n\r\n"],
        b"helloabc",
        0,
    ),
    "http-1.0-keep-alive": (
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n",
        [b"3\r\nabc\r\n", b"0\r\n\r\n"],
        b"helloabc",
        1,
    ),
}


@pytest.mark.parametrize(("head", "writes", "body", "pooled"), AFTER_REST.values(), ids=AFTER_REST)
async def test_what_follows_a_rest_is_read_as_before(
    head: bytes, writes: list[bytes], body: bytes, pooled: int
) -> None:
    """After the parser rests between chunks, a read that needs one (a cut chunk, a cut size
    line, trailers, an extension, the last chunk) gives the same body, and the connection is
    pooled exactly when the head kept it alive."""
    turns: asyncio.Queue[None] = asyncio.Queue()

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        conn.writer.write(head + b"5\r\nhello\r\n")
        for write in writes:
            await turns.get()
            conn.writer.write(write)
        await conn.wait_eof()

    async with RawUpstream(handler).running() as raw:
        pool = H1Pool("127.0.0.1", raw.port)
        async with pool.exchange(b"GET", b"/", GET_HEADERS) as response:
            received = [await anext(response.body)]
            for _ in writes[:-1]:
                turns.put_nowait(None)
                received.append(await anext(response.body))
            turns.put_nowait(None)
            received += [chunk async for chunk in response.body]
        assert b"".join(received) == body
        assert pool.idle_count == pooled
        await pool.aclose()


@pytest.mark.parametrize("wire", [b"zz\r\nabc\r\n", b"zz\r\n0\r\n\r\n", b"3\r\nabcd\r\n0\r\n\r\n"])
async def test_a_malformed_chunk_after_a_rest_is_a_protocol_error(wire: bytes) -> None:
    """A chunk size that is not hex, after the parser rested, fails the exchange as it did
    before the rest: an upstream protocol error, the connection never pooled."""
    turns: asyncio.Queue[None] = asyncio.Queue()

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        conn.writer.write(CHUNKED + b"5\r\nhello\r\n")
        await turns.get()
        conn.writer.write(wire)
        await conn.wait_eof()

    async with RawUpstream(handler).running() as raw:
        pool = H1Pool("127.0.0.1", raw.port)
        with pytest.raises(UpstreamProtocolError):
            async with pool.exchange(b"GET", b"/", GET_HEADERS) as response:
                assert await anext(response.body) == b"hello"
                turns.put_nowait(None)
                async for _ in response.body:
                    pass
        assert pool.idle_count == 0
        await pool.aclose()
