"""Bounded inflation: `stream_response.Inflater` hands a compressed body out in bounded pieces and
refuses a compression bomb; the guard relays the pieces one by one and ends a bomb's stream
with a terminal `upstream_error` event (issue 56, item 3)."""

from __future__ import annotations

import asyncio
import json
import zlib
from typing import Any

import pytest

from middleware.errors import (
    CompressionRatioExceeded,
    Outcome,
    UpstreamError,
    UpstreamProtocolError,
)
from middleware.guard import StreamGuard
from middleware.stream_response import (
    INFLATE_MAX_RATIO,
    INFLATE_RATIO_AFTER,
    INFLATE_STEP,
    Inflater,
)
from middleware.types import Message
from tests.support.apps import ROLE, SCOPE, SSE_HEADERS, chunk, scripted
from tests.support.faulty import record_outcomes
from tests.support.sseparse import parse

MiB = 1024 * 1024
GZIP_HEADERS = [*SSE_HEADERS, (b"content-encoding", b"gzip")]


def gzipped(data: bytes, level: int = 9) -> bytes:
    packer = zlib.compressobj(level, zlib.DEFLATED, 31)
    return packer.compress(data) + packer.flush()


def varied_events(size: int) -> bytes:
    """SSE events that compress ~20x, as a token stream does: about `size` bytes."""
    events, total = [], 0
    while total < size:
        events.append(chunk(f"t{len(events) * 7919 % 100003}", len(events) % 3))
        total += len(events[-1])
    return b"".join(events)


def drain(inflater: Inflater, data: bytes) -> list[bytes]:
    """Every piece `data` inflates to, taken one at a time as the relay takes them."""
    pieces = [inflater.decompress(data)]
    while piece := inflater.more():
        pieces.append(piece)
    return pieces


def test_a_chunk_is_handed_out_in_bounded_pieces_one_at_a_time() -> None:
    """Rule: a compressed chunk inflates one piece of at most INFLATE_STEP per step, the next
    only when asked; the pieces together are the body, whatever the chunk's size."""
    body = varied_events(4 * MiB)
    inflater = Inflater(b"gzip")
    first = inflater.decompress(gzipped(body))
    assert len(first) == INFLATE_STEP and inflater.inflated == INFLATE_STEP  # made no more
    pieces = [first]
    while piece := inflater.more():
        pieces.append(piece)
    pieces.append(inflater.flush())
    assert max(map(len, pieces)) <= INFLATE_STEP
    assert b"".join(pieces) == body


@pytest.mark.parametrize("wbits", [31, 15, -15], ids=["gzip", "deflate", "raw-deflate"])
def test_split_chunks_give_the_same_body_in_bounded_pieces(wbits: int) -> None:
    """Rule: however the compressed bytes are cut into chunks, and for every encoding, the
    pieces are bounded and together the body."""
    body = varied_events(MiB)
    packer = zlib.compressobj(6, zlib.DEFLATED, wbits)
    packed = packer.compress(body) + packer.flush()
    inflater = Inflater(b"gzip" if wbits == 31 else b"deflate")
    pieces: list[bytes] = []
    for start in range(0, len(packed), 7777):
        pieces.extend(drain(inflater, packed[start : start + 7777]))
    pieces.append(inflater.flush())
    assert max(map(len, pieces)) <= INFLATE_STEP
    assert b"".join(pieces) == body


def test_a_bomb_raises_once_past_the_ratio_limit() -> None:
    """Rule: a body that inflates past INFLATE_MAX_RATIO times the compressed bytes taken is
    refused (an `UpstreamError`, outcome `upstream_error`) as soon as INFLATE_RATIO_AFTER bytes
    came out: 64 MiB of one byte (~1030x) is never inflated whole."""
    bomb = gzipped(b"data: " + b"a" * (64 * MiB))
    inflater = Inflater(b"gzip")
    with pytest.raises(CompressionRatioExceeded) as caught:
        drain(inflater, bomb)
    assert inflater.inflated <= INFLATE_RATIO_AFTER + INFLATE_STEP
    error = caught.value
    assert isinstance(error, UpstreamError) and error.outcome is Outcome.UPSTREAM_ERROR
    assert error.error_object()["code"] == "compression_ratio_exceeded"
    assert str(INFLATE_MAX_RATIO) in error.message


def test_the_most_regular_real_stream_stays_under_the_ratio_limit() -> None:
    """Rule: the limit is one no stream reaches: 40 MiB of the very same token chunk,
    compressed as tightly as zlib can in one piece (~230x), inflates without an error; so does
    a short, extremely regular start (padding) under INFLATE_RATIO_AFTER."""
    same = chunk(" the") * (40 * MiB // len(chunk(" the")))
    packed = gzipped(same)
    assert len(same) > 100 * len(packed)  # the case is as regular as claimed
    inflater = Inflater(b"gzip")
    assert len(b"".join(drain(inflater, packed))) == len(same)
    padding = b":" + b" " * (INFLATE_RATIO_AFTER - 2) + b"\n"
    assert b"".join(drain(Inflater(b"gzip"), gzipped(padding))) == padding


def test_a_corrupt_body_is_an_upstream_protocol_error() -> None:
    """Rule: bytes that are not gzip end the stream with a clear upstream error, not a zlib
    traceback."""
    inflater = Inflater(b"gzip")
    with pytest.raises(UpstreamProtocolError, match="compressed body is invalid"):
        drain(inflater, b"\x1f\x8b\x08\x00" + b"\xff" * 64)


async def relay(script: list[bytes], sent: list[Message], *, resume: bool = False) -> None:
    """Run the guard over an app that sends `script` gzip-encoded, into `sent`."""
    forever = asyncio.Event()
    inbox = [{"type": "http.request", "body": b"{}", "more_body": False}]

    async def receive() -> Message:
        if inbox:
            return inbox.pop(0)
        await forever.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    app: Any = scripted([(0, data) for data in script], headers=GZIP_HEADERS)
    await StreamGuard(app, resume=resume)(SCOPE, receive, send)


async def test_the_guard_relays_a_big_chunk_in_bounded_writes() -> None:
    """Rule: one compressed chunk that inflates to 8 MiB reaches the client as writes of at
    most INFLATE_STEP bytes each (never inflated whole into one), byte for byte."""
    body = ROLE + varied_events(8 * MiB)
    sent: list[Message] = []
    await relay([gzipped(body)], sent)
    writes = [m["body"] for m in sent if m["type"] == "http.response.body" and m["body"]]
    assert len(writes) > 8 * MiB // INFLATE_STEP
    assert max(map(len, writes)) <= INFLATE_STEP
    assert b"".join(writes) == body


async def test_a_bomb_ends_the_stream_with_a_terminal_upstream_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Rule: a bomb mid-stream ends it with one terminal error event (code
    `compression_ratio_exceeded`), outcome `upstream_error`, and no traceback logged."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = packer.compress(ROLE) + packer.flush(zlib.Z_SYNC_FLUSH)
    bomb = packer.compress(b"data: " + b"a" * (64 * MiB)) + packer.flush()
    sent: list[Message] = []
    with record_outcomes() as outcomes:
        await relay([head, bomb], sent)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert len(body) < INFLATE_RATIO_AFTER + 2 * INFLATE_STEP
    assert body.startswith(ROLE)
    error = json.loads(parse(body)[-1][1])["error"]
    assert error["code"] == "compression_ratio_exceeded"
    assert outcomes == [Outcome.UPSTREAM_ERROR]
    assert not [r for r in caplog.records if r.exc_info]


async def test_with_resume_the_pieces_are_sliced_and_stamped_like_any_chunk() -> None:
    """Rule: with resume on (a longer chunk taken in slices), a compressed chunk's pieces are
    sliced in turn: each event arrives once, whole and in order, with its id `<sid>:<n>`."""
    body = ROLE + varied_events(MiB)
    sent: list[Message] = []
    await relay([gzipped(body)], sent, resume=True)
    writes = [m["body"] for m in sent if m["type"] == "http.response.body" and m["body"]]
    events = parse(b"".join(writes))
    assert [data for _, data, _ in events] == [data for _, data, _ in parse(body)]
    assert [last_id.rsplit(":", 1)[1] for _, _, last_id in events] == [
        str(n) for n in range(1, len(events) + 1)
    ]
