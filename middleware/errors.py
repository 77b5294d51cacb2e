"""The small error hierarchy every stream failure is translated into.

Errors are translated once, at the boundary where they happen (httpcore's exceptions in
the proxy, timers in the guard), into one of these. The guard then turns an error into a
status code and a JSON body when response headers have not been sent yet, or into one
terminal SSE error event in the stream's own dialect when they have.
"""

from __future__ import annotations

import json
from enum import StrEnum


class Outcome(StrEnum):
    """How a stream ended: exactly one per stream, in spans, metrics and the log line."""

    COMPLETED = "completed"
    CLIENT_DISCONNECTED = "client_disconnected"
    IDLE_TIMEOUT = "idle_timeout"
    FIRST_TOKEN_TIMEOUT = "first_token_timeout"
    MAX_DURATION = "max_duration"
    SLOW_CLIENT = "slow_client"
    UPSTREAM_ERROR = "upstream_error"  # a failure, or the upstream's own 5xx passed through
    RATE_LIMITED = "rate_limited"  # the upstream's own 429 passed through
    REJECTED_OVERLOAD = "rejected_overload"  # refused at admission: too many in flight
    REJECTED_DRAINING = "rejected_draining"  # refused at admission: draining
    SHUTDOWN = "shutdown"
    CANCELLED = "cancelled"  # resume: stopped by DELETE on the stream's URL
    GRACE_EXPIRED = "resume_grace_expired"  # resume: no reader came back within the grace


# The outcomes the per-stream code compares with, as module globals (see `phases.START`).
COMPLETED, SLOW_CLIENT, UPSTREAM_ERROR = (
    Outcome.COMPLETED,
    Outcome.SLOW_CLIENT,
    Outcome.UPSTREAM_ERROR,
)


class StreamError(Exception):
    """Base class: a failure with the status, OpenAI-style type/code and outcome it maps to."""

    status: int = 502
    type: str = "upstream_error"
    code: str = "upstream_error"
    outcome: Outcome = Outcome.UPSTREAM_ERROR
    retryable: bool = False
    default_message: str = "the upstream failed"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.default_message)

    @property
    def message(self) -> str:
        return str(self.args[0])

    def error_object(self) -> dict[str, str]:
        return {"message": self.message, "type": self.type, "code": self.code}

    def json_body(self) -> bytes:
        return json.dumps({"error": self.error_object()}, separators=(",", ":")).encode()


class UpstreamError(StreamError):
    """The upstream broke the exchange: reset, closed early, sent invalid HTTP."""


class UpstreamConnectError(UpstreamError):
    code = "upstream_unreachable"
    default_message = "could not connect to the upstream"


class UpstreamProtocolError(UpstreamError):
    code = "upstream_protocol_error"
    default_message = "the upstream broke the HTTP exchange"


class CompressionRatioExceeded(UpstreamError):
    """A compressed body that inflates past the ratio no stream reaches (a bomb):
    `stream_response.INFLATE_MAX_RATIO`."""

    code = "compression_ratio_exceeded"
    default_message = "the upstream's compressed body inflates past the ratio limit"


class StreamTimeout(StreamError):
    status = 504
    type = "timeout"


class FirstTokenTimeout(StreamTimeout):
    code = "first_token_timeout"
    outcome = Outcome.FIRST_TOKEN_TIMEOUT
    default_message = "no token from the upstream within the first-token timeout"


class IdleTimeout(StreamTimeout):
    code = "idle_timeout"
    outcome = Outcome.IDLE_TIMEOUT
    default_message = "the upstream sent nothing within the idle timeout"


class MaxDuration(StreamTimeout):
    code = "max_duration"
    outcome = Outcome.MAX_DURATION
    default_message = "the stream exceeded its maximum duration"


class ShuttingDown(StreamError):
    status = 503
    type = "unavailable"
    code = "shutting_down"
    outcome = Outcome.SHUTDOWN
    retryable = True
    default_message = "the server is shutting down; retry the request"


class TooManyStreams(StreamError):
    """Load shedding: the request is refused before it reaches the app."""

    status = 503
    type = "unavailable"
    code = "too_many_streams"
    outcome = Outcome.REJECTED_OVERLOAD
    retryable = True
    default_message = "this server holds its maximum number of streams; retry shortly"


class Draining(ShuttingDown):
    """Drain under way: a new request is refused before it reaches the app."""

    outcome = Outcome.REJECTED_DRAINING


class Cancelled(StreamError):
    """Resume: `DELETE /sidestream/v1/streams/<id>` stopped the stream."""

    status = 409
    type = "cancelled"
    code = "cancelled"
    outcome = Outcome.CANCELLED
    default_message = "the stream was stopped"
