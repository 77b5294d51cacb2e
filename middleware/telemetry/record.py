"""One request's telemetry: its span, its share of the metrics, its access-log line.

A `StreamRecord` is made when the request's cycle is (`observed.ObservedCycle`: the span
starts at request arrival, with an explicit timestamp) and finished after the cycle has run.
Between the two, the cycle adds each content-carrying chunk's time to `gaps` (on its token
path through `tally`, the relay core's `Tally`, which appends to `gaps.times` directly) and
calls `capture()` when content capture is on; nothing else of telemetry runs per chunk. All
times are read from the monotonic clock the cycle already keeps and turned into wall-clock
nanoseconds against the pair (time_ns, monotonic) taken at arrival, so span durations and the
TTFT attribute agree with the cycle's own deadlines.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Span

from middleware.dialects import Dialect, select
from middleware.speedups import Tally
from middleware.sse import Event
from middleware.telemetry import semconv
from middleware.telemetry.content import BODY_CAP, event_text, request_attributes
from middleware.telemetry.direct import DirectSpan
from middleware.telemetry.gaps import TIMES_KEPT, Gaps
from middleware.types import Message, Receive, Scope

if TYPE_CHECKING:
    from middleware.telemetry.pipeline import Pipeline


class StreamRecord:
    """Telemetry state of one request; see the module docstring."""

    __slots__ = (
        "_body",
        "_body_done",
        "_request_id",
        "_truncated",
        "agent",
        "call",
        "direct",
        "gaps",
        "genai",
        "method",
        "path",
        "request",
        "server",
        "span",
        "t0",
        "t0_ns",
        "tally",
        "telemetry",
        "text",
        "text_len",
    )

    def __init__(self, telemetry: Pipeline, scope: Scope, started: float) -> None:
        self.telemetry = telemetry
        self.t0_ns = time.time_ns()
        self.t0 = started  # the cycle's monotonic clock at arrival
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        self.method: str = scope.get("method", "GET")
        self.path: str = scope.get("path", "")
        self.genai: Dialect | None = select(self.path)
        # A `POST` to a GenAI path: a GenAI call unless it streams, or is not answered in JSON
        # (`kinds.classify`); its JSON body is read for usage (`answer`).
        self.call = self.genai is not None and self.method == "POST"
        # The headers read here, in one pass: the client's request id and user agent (the
        # first of each) and the propagator's trace context fields.
        fields = telemetry.propagation_fields
        request_id = agent = None
        carrier: dict[str, str] = {}
        for key, value in headers:
            if key == b"user-agent":
                if agent is None:
                    agent = value[:256].decode("latin-1")
            elif key == b"x-request-id":
                if request_id is None:
                    request_id = value[:128].decode("latin-1")
            elif key in fields:  # repeated: one comma-separated value, as HTTP joins them
                name, text = key.decode("latin-1"), value.decode("latin-1")
                carrier[name] = f"{carrier[name]},{text}" if name in carrier else text
        self.agent = agent
        self._request_id = request_id  # the log line's, made there when the client sent none
        self.request: dict[str, Any] = {}
        self._body: bytes | bytearray = bytearray()
        self._body_done = False
        self._truncated = False
        self.gaps = gaps = Gaps()
        # What the relay counts (its token path, and telemetry's cycle the other chunks).
        self.tally = Tally(gaps.times, TIMES_KEPT, gaps.fold)
        self.text: list[str] | None = [] if telemetry.capture_content else None
        self.text_len = 0
        self.server = self._server(scope)
        self.span: Span | None = None  # the current span while the stream runs
        self.direct: DirectSpan | None = None  # the span to end, with direct spans
        tracer, direct = telemetry.tracer, telemetry.direct
        if tracer is not None or direct is not None:
            parent = telemetry.propagator.extract(carrier) if carrier else None
            # Named by its method until its end says it was a GenAI operation (`kinds`): a
            # CORS preflight on a chat path is not a chat.
            name = self.method
            attributes = self._http_attributes(scope)
            if direct is not None:
                self.direct = direct.start(name, parent, attributes, self.t0_ns)
                self.span = self.direct.current
            elif tracer is not None:
                self.span = tracer.start_span(
                    name,
                    context=parent,
                    kind=telemetry.span_kind,
                    start_time=self.t0_ns,
                    attributes=attributes,
                )

    def _http_attributes(self, scope: Scope) -> dict[str, str | int]:
        attrs: dict[str, str | int] = {
            semconv.HTTP_REQUEST_METHOD: self.method,
            semconv.URL_PATH: self.path,  # never the query: it may carry keys
            semconv.URL_SCHEME: scope.get("scheme", "http"),
        }
        client = scope.get("client")
        if client:
            attrs[semconv.CLIENT_ADDRESS] = client[0]
        if self.agent is not None:
            attrs[semconv.USER_AGENT_ORIGINAL] = self.agent
        attrs.update(self.server)
        return attrs

    def _server(self, scope: Scope) -> dict[str, str | int]:
        telemetry = self.telemetry
        if telemetry.server_address is not None:
            attrs: dict[str, str | int] = {semconv.SERVER_ADDRESS: telemetry.server_address}
            if telemetry.server_port is not None:
                attrs[semconv.SERVER_PORT] = telemetry.server_port
            return attrs
        server = scope.get("server")
        if server and server[1] is not None:
            return {semconv.SERVER_ADDRESS: server[0], semconv.SERVER_PORT: server[1]}
        return {}

    def tap(self, receive: Receive) -> Receive:
        """`receive` that also keeps up to BODY_CAP bytes of the request body, to parse once
        (on GenAI paths, for the request's model and parameters)."""
        return _Tapped(self, receive)

    def _took(self, message: Message) -> None:
        """A message the tapped `receive` returned."""
        if not self._body_done and message["type"] == "http.request":
            chunk: bytes = message.get("body", b"")
            room = BODY_CAP - len(self._body)
            if len(chunk) > room:
                self._truncated = True
            if chunk and room > 0:
                self._body += chunk[:room]
            if not message.get("more_body", False):
                self._body_done = True
                self.request = request_attributes(bytes(self._body), not self._truncated)
                self._body = b""  # the prompt is not kept

    # -- per content-carrying chunk ---------------------------------------------------------

    def capture(self, events: list[Event], dialect: Dialect) -> None:
        """With capture_content: keep the text of a token chunk, up to capture_limit."""
        text = self.text
        if text is not None and self.text_len < self.telemetry.capture_limit:
            for event in events:
                piece = event_text(dialect.name, event)
                if piece:
                    piece = piece[: self.telemetry.capture_limit - self.text_len]
                    text.append(piece)
                    self.text_len += len(piece)

    # -- the end ------------------------------------------------------------------------------

    @property
    def request_id(self) -> str:
        """The client's `x-request-id`, else one made now (and kept): unique, not secret, so
        random bits, not uuid4 (a getrandom() system call per request)."""
        if not self._request_id:  # none, or an empty header
            self._request_id = f"{random.getrandbits(128):032x}"
        return self._request_id

    def ns(self, at: float) -> int:
        """A reading of the cycle's (monotonic) clock as wall-clock nanoseconds."""
        return self.t0_ns + round((at - self.t0) * 1e9)


class _Tapped:
    """`StreamRecord.tap`'s receive: an object of two slots rather than a closure (a
    function and its cells), as the stream holds it for as long as it runs."""

    __slots__ = ("receive", "record")

    def __init__(self, record: StreamRecord, receive: Receive) -> None:
        self.record = record
        self.receive = receive

    async def __call__(self) -> Message:
        message = await self.receive()
        self.record._took(message)
        return message
