"""Resumable streams: what `StreamGuard(..., resume=...)` takes.

With resume on, every SSE response is named (`Sidestream-Stream-Id`, 128 random bits) and
each of its events stamped `id: <stream-id>:<n>` on its way out (`stamper`, the relay's
`Edit`); the stamped events go to a store (`memory`, or `redis` for any replica). A request
with `Last-Event-ID: <id>:<n>`, or to `/sidestream/v1/streams/<id>`, is answered from the
store by `responder` and never reaches the app. A client's disconnect starts a grace period
(`producer`) instead of an immediate cancel.

Resume and stop must repeat the first request's credentials (`ids.credential_hash`, keyed
by `secret`): the replicas sharing a store share the secret, and a replica with another one
cannot resume or stop their streams. One process's memory store needs no given secret (a
random one is drawn); any other store does.

With resume off (the default) none of this exists: no edit, no check per chunk.
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from middleware.resume.ids import (
    CREDENTIAL_HEADERS,
    MIN_SECRET_BYTES,
    credential_hash,
    new_stream_id,
)
from middleware.resume.memory import MemoryStore
from middleware.resume.producer import Producer
from middleware.resume.redis_connect import shown
from middleware.resume.responder import PREFIX, is_stop, serve
from middleware.resume.spans import current_link
from middleware.resume.store import Limits, Store
from middleware.types import ASGIApp, Scope

if TYPE_CHECKING:
    from middleware.cycle import Cycle

__all__ = ["Limits", "Resume"]

logger = logging.getLogger("sidestream")
STREAM_ID = b"sidestream-stream-id"
# A resumable stream takes a longer chunk in slices of this size, a loop turn between them
# (`Relay._slices`): every event of it gets an id and goes to the store, in Python, and a fast
# upstream's many streams would otherwise hold the loop from all others for seconds.
SLICE_BYTES = 8 * 1024


def make_store(
    store: str | Store, limits: Limits, password: str | None = None, ca: str | None = None
) -> Store:
    """The store a URL names; `password` (apart from the URL) and `ca` are Redis's."""
    if isinstance(store, str) and store.startswith(
        ("redis://", "rediss://", "unix://", "redis+sentinel://", "redis+cluster://")
    ):
        from middleware.resume.redis import RedisStore

        return RedisStore(store, limits, password=password, ca=ca)
    if password is not None or ca is not None:
        raise ValueError("resume store: a password and CA certificates are for a Redis URL")
    if not isinstance(store, str):
        return store
    if store == "memory":
        return MemoryStore(limits)
    raise ValueError(f"resume store: expected 'memory' or a Redis URL, got {shown(store)!r}")


def credential_key(store: Store, secret: bytes | None) -> bytes:
    """The key of the credential hash: `secret`, or for one process's memory store a random
    one (its streams live and die with the process); a store replicas may share needs it."""
    if secret is not None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"the resume secret must have {MIN_SECRET_BYTES} bytes at least")
        return secret
    if isinstance(store, MemoryStore):
        return secrets.token_bytes(32)
    raise ValueError("a shared resume store needs the replicas' shared secret (secret=...)")


class Resume:
    """The process's resume state: the store, its limits, the streams produced here."""

    def __init__(
        self,
        store: str | Store = "memory",
        *,
        grace: float = 30.0,
        ttl: float = 600.0,
        max_bytes: int = 1024 * 1024,
        memory: int = 256 * 1024 * 1024,
        keepalive: float | None = 15.0,
        tracer: Any = None,
        secret: bytes | None = None,
        credential_headers: Iterable[str | bytes] = CREDENTIAL_HEADERS,
        store_password: str | None = None,
        store_ca: str | None = None,
    ) -> None:
        """`secret` keys the credential hash; `credential_headers` name the request headers a
        resume or stop must repeat (replacing `Authorization`, `X-Api-Key`, `Cookie`);
        `store_password` and `store_ca` are a Redis store's, apart from its URL."""
        self.limits = Limits(max_bytes=max_bytes, memory=memory, ttl=ttl, grace=grace)
        self.store = make_store(store, self.limits, store_password, store_ca)
        self.store.on_stop = self._stop_here
        self._key = credential_key(self.store, secret)
        self.credential_headers = tuple(
            (n.encode("latin-1") if isinstance(n, str) else n).lower() for n in credential_headers
        )
        self.keepalive = keepalive
        # `middleware.telemetry.resume_spans.ResumeSpans`: each resume request gets a span.
        self.tracer = tracer
        self.live: dict[str, Producer] = {}
        self.failures = 0  # store failures seen by resume requests (a metric reads it)

    def route(self, scope: Scope) -> ASGIApp | None:
        """The resume responder for a resume or stop request, else None (once per request)."""
        if scope["path"].startswith(PREFIX):
            return functools.partial(serve, self)
        for name, _ in scope["headers"]:
            if name == b"last-event-id":
                return functools.partial(serve, self)
        return None

    def is_stop(self, scope: Scope) -> bool:
        """A request `route` took is a stop, which holds no stream (the guard admits it
        always), not a reader (counted toward `max_streams`, refused while draining)."""
        return is_stop(scope)

    def begin(self, cycle: Cycle, start: dict[str, Any]) -> None:
        """An SSE stream starts: name it, stamp it, log it."""
        stream_id = new_stream_id()
        store = self.store
        credentials = self.credentials(stream_id, cycle.scope["headers"])
        origin = ""
        for name, value in start["headers"]:
            if name.lower() == b"access-control-allow-origin":
                origin = value.decode("latin-1")
        link = "" if self.tracer is None else current_link()
        log = store.open(stream_id, credentials, origin, link)
        producer = Producer(cycle, stream_id, log, self.limits.grace, self.live)
        self.live[stream_id] = producer
        cycle.resumable = producer
        if cycle.edit is not None:  # forced usage's hiding: run by the stamper, first
            producer.stamper.after(cycle.edit)
        cycle.edit = producer.stamper
        cycle.slice_bytes = SLICE_BYTES
        start["headers"].append((STREAM_ID, stream_id.encode()))

    def credentials(self, stream_id: str, headers: list[tuple[bytes, bytes]]) -> str:
        """The credential hash of a request's headers for `stream_id` (stored, or compared)."""
        return credential_hash(self._key, stream_id, headers, self.credential_headers)

    async def stop(self, stream_id: str) -> None:
        if not self._stop_here(stream_id):
            await self.store.stop_elsewhere(stream_id)

    def _stop_here(self, stream_id: str) -> bool:
        producer = self.live.get(stream_id)
        if producer is None:
            return False
        producer.stop()
        return True

    def prometheus_text(self) -> bytes:
        """The resume metrics, in the Prometheus text format (appended to `/metrics`)."""
        name = "sidestream_resume_store_failures_total"
        return (
            f"# HELP {name} Resume store writes and reads that failed (the streams went on).\n"
            f"# TYPE {name} counter\n{name} {self.failures + self.store.failures}\n"
            "# HELP sidestream_resume_streams_live Resumable streams being generated here.\n"
            "# TYPE sidestream_resume_streams_live gauge\n"
            f"sidestream_resume_streams_live {len(self.live)}\n"
        ).encode()

    def store_failed(self, exc: BaseException) -> None:
        self.failures += 1
        logger.warning("resume store failed: %s", exc)

    async def aclose(self) -> None:
        await self.store.aclose()
