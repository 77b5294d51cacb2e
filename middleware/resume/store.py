"""What a resume store is: the producer's side (sync, never raising into the relay) and the
reader's side (async), and the errors a resume request is answered with.

A stream's log holds its stamped events in order, then its *tail* (the bytes that end it:
a terminal error event, or nothing) and its end. A reader attached after event n gets
events n+1…, then the live ones as they come, then the tail: each exactly once.

An event larger than the log's `max_bytes` is relayed live but never held whole: the log
gets `LOST` in its place (the stamper's choice, `stamper.Stamper`), and a reader that comes
to it ends with `ResumeGap` instead of a stream with a hole in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class ResumeError(Exception):
    status = 500
    code = "resume_error"
    message = "resume failed"


class StreamNotFound(ResumeError):
    """Unknown, expired, or another tenant's: the same answer, so existence does not leak."""

    status = 404
    code = "stream_not_found"
    message = "no resumable stream with this id"


class ResumePointGone(ResumeError):
    status = 410
    code = "resume_point_gone"
    message = "the events after this point are no longer stored"


class ResumeGap(ResumeError):
    """The reader's next event is `LOST`: the stream cannot be resumed past it."""

    status = 410
    code = "resume_gap"
    message = "an event after this point was too large to store: the stream cannot be resumed"


# What a log holds in place of an event too large to store: no event is empty (each has at
# least its id line), so an empty entry is never a real one.
LOST = b""


class StoreUnavailable(ResumeError):
    status = 503
    code = "resume_store_unavailable"
    message = "the resume store is unavailable"


@dataclass(frozen=True, slots=True)
class Limits:
    """The store's bounds: per stream bytes, all streams' bytes (memory), the time a
    finished stream stays resumable, the grace after the last reader left."""

    max_bytes: int = 1024 * 1024
    memory: int = 256 * 1024 * 1024
    ttl: float = 600.0
    grace: float = 30.0


class ProducerLog(Protocol):
    """The producing side of one stream's log: sync, and it never raises."""

    def append(self, event: bytes) -> None: ...

    def retract(self, count: int) -> None: ...

    def end(self, tail: bytes, outcome: str) -> None: ...

    @property
    def max_bytes(self) -> int:
        """The stream's bound: an event larger than this is `LOST`, not stored."""

    @property
    def resumes(self) -> int:
        """Resume requests served for this stream so far."""

    @property
    def end_seen(self) -> bool:
        """Some resume reader has read the stream's end."""

    async def remote_readers(self) -> bool:
        """Readers attached elsewhere (another replica) keep the stream alive."""


class Reader(Protocol):
    origin: str  # the first response's Access-Control-Allow-Origin ("" when it had none)
    link: str  # the generating stream's span context, `<trace id>-<span id>` ("": none)

    async def read(self, timeout: float | None) -> tuple[list[bytes], bool]:
        """The next events (none when `timeout` passed first) and whether the end is in
        them; StoreUnavailable or ResumePointGone mid-stream end the reader's stream."""

    def close(self) -> None: ...


class Store(Protocol):
    limits: Limits
    failures: int  # writes and reads that failed (the stream went on)
    on_stop: Callable[[str], object] | None  # a stop asked by another replica (set by the hub)

    def open(
        self, stream_id: str, credentials: str, origin: str = "", link: str = ""
    ) -> ProducerLog: ...

    async def attach(self, stream_id: str, after: int, credentials: str) -> Reader: ...

    async def check(self, stream_id: str, credentials: str) -> None:
        """StreamNotFound unless the stream is here (or in Redis) with these credentials."""

    async def stop_elsewhere(self, stream_id: str) -> None:
        """Ask the replica producing `stream_id` to stop it (Redis: publish; memory: none)."""

    async def ping(self) -> None:
        """At start: warn (never fail) when the store cannot be reached."""

    async def aclose(self) -> None: ...
